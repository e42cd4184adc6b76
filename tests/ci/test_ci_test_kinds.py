"""Fast tests and system tests (tests/conftest.py): every test file that starts other processes
is in the system table, and every file the table names exists."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

#: What a test file that starts other processes says somewhere in its text.
STARTS_PROCESSES = re.compile(
    r"\bsubprocess\b|ManagedProcess|\bStack\(|start_agent\(|needs_services|StdioServerParameters|run_killed\("
)


def _conftest():
    spec = importlib.util.spec_from_file_location("tests_conftest", TESTS / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SYSTEM_TEST_FILES = _conftest().SYSTEM_TEST_FILES


def starting_processes(tests: Path) -> set[str]:
    return {
        path.relative_to(tests).as_posix()
        for path in tests.rglob("test_*.py")
        if path.name != Path(__file__).name  # this file names the patterns it looks for
        and STARTS_PROCESSES.search(path.read_text(encoding="utf-8"))
    }


def test_every_file_that_starts_processes_is_a_system_test() -> None:
    assert len(list(TESTS.rglob("test_*.py"))) > 50  # the whole tree, not a part
    missing = sorted(starting_processes(TESTS) - SYSTEM_TEST_FILES)
    assert missing == [], f"add these to SYSTEM_TEST_FILES in tests/conftest.py: {missing}"


def test_every_file_of_the_table_exists() -> None:
    assert sorted(f for f in SYSTEM_TEST_FILES if not (TESTS / f).is_file()) == []


def test_the_scan_finds_a_new_file_that_starts_a_process(tmp_path: Path) -> None:
    (tmp_path / "part").mkdir()
    (tmp_path / "part" / "test_part_new.py").write_text("import subprocess\n")
    (tmp_path / "part" / "test_part_pure.py").write_text("def test_sum():\n    assert 1 + 1 == 2\n")
    assert starting_processes(tmp_path) == {"part/test_part_new.py"}


def _pytest(tests: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--strict-markers",
            "--rootdir",
            str(tests.parent),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tests.parent,
    )


def test_the_marker_selects_the_files_of_the_table(tmp_path: Path) -> None:
    """tests/conftest.py in a copy: -m 'not system' deselects a listed file's tests (and its run
    passes, as Pants needs), runs the others; -m system the other way round."""
    tests = tmp_path / "tests"
    tests.mkdir()
    shutil.copy(TESTS / "conftest.py", tests / "conftest.py")
    system_file = tests / sorted(SYSTEM_TEST_FILES)[0]
    system_file.parent.mkdir(parents=True)
    system_file.write_text("def test_starts_a_part():\n    pass\n")
    (tests / "fast").mkdir()
    (tests / "fast" / "test_fast_sum.py").write_text("def test_sum():\n    assert 1 + 1 == 2\n")
    alone = _pytest(tests, "-m", "not system", str(system_file))
    assert alone.returncode == 0 and "1 deselected" in alone.stdout, alone.stdout + alone.stderr
    fast = _pytest(tests, "-m", "not system", str(tests))
    assert fast.returncode == 0 and "1 passed, 1 deselected" in fast.stdout, fast.stdout + fast.stderr
    system = _pytest(tests, "-m", "system", str(tests))
    assert system.returncode == 0 and "1 passed, 1 deselected" in system.stdout, system.stdout + system.stderr
    (tests / "fast" / "test_fast_empty.py").write_text("# no tests yet\n")
    empty = _pytest(tests, "-m", "not system", str(tests / "fast" / "test_fast_empty.py"))
    assert empty.returncode == pytest.ExitCode.NO_TESTS_COLLECTED  # nothing deselected: still a failure
