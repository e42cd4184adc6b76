"""The import layers of docs/architecture.md (the plugin's `import-layers` linter,
pants-plugins/calcx_pants/import_layers.py): the tree follows them, and a wrong import, a relative
one or one hidden in a function, fails the check with its file and line, run as `./pants lint`
runs it (from file contents) and as a script; the table's rows are in layer order, and a row that
may import a later one fails with both rows named."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "pants-plugins" / "calcx_pants" / "import_layers.py"


def _layers_module():
    spec = importlib.util.spec_from_file_location("calcx_pants_import_layers", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


layers = _layers_module()


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    """docs/architecture.md and src/python/calcx, copied, to plant imports in."""
    (tmp_path / "docs").mkdir()
    shutil.copy(REPO / layers.DOC, tmp_path / layers.DOC)
    shutil.copytree(REPO / layers.SOURCES, tmp_path / layers.SOURCES)
    return tmp_path


def _plant(repo: Path, relative: str, code: str) -> None:
    path = repo / layers.SOURCES / relative
    path.write_text(path.read_text(encoding="utf-8") + code, encoding="utf-8")


def test_the_tree_follows_the_table() -> None:
    assert len(list((REPO / layers.SOURCES).rglob("*.py"))) > 100  # the whole tree, not a part
    assert layers.violations(REPO) == []


def test_the_table_is_read_with_its_words() -> None:
    rules = layers.read_rules((REPO / layers.DOC).read_text(encoding="utf-8"))
    assert rules["calcx.contract"] == frozenset()
    assert rules["calcx.api"] == {"calcx.contract"}
    assert {"calcx.server", "calcx.controller", "calcx.stub_llm"} <= rules["calcx.rehearse"]  # everything above
    assert "calcx.trainer" not in rules["calcx.rehearse"] and "calcx.faults" in rules["calcx.cli"]  # the parts


def test_the_rows_are_in_layer_order() -> None:
    doc = (REPO / layers.DOC).read_text(encoding="utf-8")
    names = [name for _, name, _ in layers.read_rows(doc)]
    assert len(names) > 15 and names[-1] == "calcx.cli"  # the whole table, `the parts` last
    assert layers.forward_references(doc) == []


def test_a_row_that_may_import_a_later_row_fails(repo_copy: Path) -> None:
    """The loop the table once allowed: calcx.data -> calcx.anchor -> calcx.trainer -> calcx.data."""
    doc_path = repo_copy / layers.DOC
    doc = doc_path.read_text(encoding="utf-8")
    lines = {name: line for line, name, _ in layers.read_rows(doc)}
    data_row = next(row for row in doc.splitlines() if row.startswith("| `calcx.data` |"))
    doc_path.write_text(doc.replace(data_row, data_row[:-2] + ", `calcx.anchor` |"), encoding="utf-8")
    assert layers.violations(repo_copy) == [
        f"docs/architecture.md:{lines['calcx.data']}: row calcx.data may import calcx.anchor, whose row "
        f"(line {lines['calcx.anchor']}) is below it: a row may name only packages of the rows above it"
    ]
    run = subprocess.run([sys.executable, str(SCRIPT), str(repo_copy)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "row calcx.data may import calcx.anchor" in run.stdout


def test_the_parts_before_the_last_row_fails_and_everything_above_does_not() -> None:
    doc = (
        "## Python packages\n\n| package | what | may import |\n|---|---|---|\n"
        "| `calcx.a` | the base | the parts |\n| `calcx.b` | above it | everything above |\n"
        "| `calcx.c` | the command | the parts |\n"
    )
    assert layers.forward_references(doc) == [
        "docs/architecture.md:5: row calcx.a may import `the parts`, which reaches the rows below it "
        "(calcx.b, calcx.c): only the last row may"
    ]


def test_a_wrong_import_fails_with_its_file_and_line(repo_copy: Path) -> None:
    _plant(repo_copy, "api/tokens.py", "\n\ndef _late():\n    from calcx.server.app import create_app\n")
    found = layers.violations(repo_copy)
    assert len(found) == 1 and "calcx/api/tokens.py:" in found[0]
    assert "calcx.api imports calcx.server.app" in found[0] and "lets it import calcx.contract" in found[0]
    run = subprocess.run([sys.executable, str(SCRIPT), str(repo_copy)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "calcx.api imports calcx.server.app" in run.stdout


def test_relative_and_type_checking_imports_count(repo_copy: Path) -> None:
    _plant(
        repo_copy,
        "contract/env.py",
        "\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..procs import procutil\n",
    )
    _plant(repo_copy, "procs/managed.py", "\nfrom . import procutil as _same_package\n")
    found = layers.violations(repo_copy)
    assert len(found) == 1 and "calcx.contract imports calcx.procs" in found[0]


def test_a_package_without_a_row_fails(repo_copy: Path) -> None:
    (repo_copy / layers.SOURCES / "newpart").mkdir()
    (repo_copy / layers.SOURCES / "newpart" / "__init__.py").write_text("")
    assert any("package calcx.newpart has no row" in line for line in layers.violations(repo_copy))


def test_check_takes_the_contents_the_lint_rule_hands_it() -> None:
    doc = (
        "## Python packages\n\n| package | what | may import |\n|---|---|---|\n"
        "| `calcx.a` | the base | standard library |\n| `calcx.b` | above it | `calcx.a` |\n"
    )
    sources = {
        "src/python/calcx/a/__init__.py": "from calcx.b import x\n",
        "src/python/calcx/b/m.py": "import calcx\nfrom calcx.a import y\nfrom . import n\n",
    }
    assert layers.check(doc, sources) == [
        "src/python/calcx/a/__init__.py:1: calcx.a imports calcx.b; docs/architecture.md lets it import no calcx package"
    ]
    assert layers.report([]).startswith("imports of src/python/calcx follow")


def test_a_module_belongs_to_the_longest_row_it_lies_in() -> None:
    rows = ["calcx.trainer", "calcx.trainer.rollouts", "calcx.trainer.run"]
    assert layers.package_of(layers.PurePosixPath("trainer/rollouts/group.py"), rows) == "calcx.trainer.rollouts"
    assert layers.package_of(layers.PurePosixPath("trainer/run/__init__.py"), rows) == "calcx.trainer.run"
    assert layers.package_of(layers.PurePosixPath("trainer/__init__.py"), rows) == "calcx.trainer"
    assert (
        layers.package_of(layers.PurePosixPath("trainer/run_dir/names.py"), rows) == "calcx.trainer"
    )  # no row of its own
    assert layers.package_of(layers.PurePosixPath("cli.py"), rows) == "calcx.cli"


def test_sub_package_rows_are_layers_of_their_own() -> None:
    doc = (
        "## Python packages\n\n| package | what | may import |\n|---|---|---|\n"
        "| `calcx.t` | the index | standard library |\n"
        "| `calcx.t.low` | below | standard library; never verl, torch |\n"
        "| `calcx.t.high` | above | verl, `calcx.t.low` |\n"
    )
    sources = {
        "src/python/calcx/t/low/a.py": "from calcx.t import high\nimport torch.nn\n",
        "src/python/calcx/t/high/b.py": "import verl\nfrom calcx.t.low.a import x\nfrom ..low import a\n",
    }
    assert layers.read_forbidden(doc)["calcx.t.low"] == {"verl", "torch"}
    assert layers.check(doc, sources) == [
        "src/python/calcx/t/low/a.py:1: calcx.t.low imports calcx.t.high; docs/architecture.md lets it import no calcx package",
        "src/python/calcx/t/low/a.py:2: calcx.t.low imports torch.nn; docs/architecture.md says it never imports torch, verl",
    ]


def test_the_trainers_rollouts_importing_verl_fails(repo_copy: Path) -> None:
    """calcx.trainer.rollouts runs in verl's workers and in the eval-only driver alike: no verl there."""
    _plant(repo_copy, "trainer/rollouts/translate.py", "\n\ndef _late():\n    from verl.protocol import DataProto\n")
    found = layers.violations(repo_copy)
    assert len(found) == 1 and "calcx/trainer/rollouts/translate.py:" in found[0]
    assert "calcx.trainer.rollouts imports verl.protocol" in found[0] and "never imports ray, torch, verl" in found[0]
    run = subprocess.run([sys.executable, str(SCRIPT), str(repo_copy)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "calcx.trainer.rollouts imports verl.protocol" in run.stdout


def test_the_trainers_workers_importing_the_driver_fails(repo_copy: Path) -> None:
    """The driver starts verl's workers (launch imports the task runner), never the other way."""
    _plant(repo_copy, "trainer/workers/task_runner.py", "\nfrom calcx.trainer import run as _driver\n")
    found = layers.violations(repo_copy)
    assert len(found) == 1 and "calcx.trainer.workers imports calcx.trainer.run;" in found[0]
