"""The agent image is reproducible: built twice from the same PEX and base, each time in a new
container into a new directory (the builder keeps no cache), it gets the same image ID; built
from a PEX with one changed source file, it gets another one. CI runs this on every change.
"""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

from calcx.image.build import Built, build
from calcx.image.recipes import AGENT

CHANGED_SOURCE = "calcx/agent/__init__.py"


@pytest.fixture(scope="module")
def first(agent_pex: Path, base_image: str, epoch: int) -> Built:
    return build(AGENT, agent_pex, base_image, epoch)


def test_two_builds_give_the_same_image_id(first: Built, agent_pex: Path, base_image: str, epoch: int) -> None:
    second = build(AGENT, agent_pex, base_image, epoch)
    assert second.layer_diff_id == first.layer_diff_id
    assert second.image_id == first.image_id
    inspected = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}} {{.Created}} {{.Config.User}}",
                                first.image_id], capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert inspected == [first.image_id, "2024-01-01T00:00:00Z", f"{AGENT.uid}:{AGENT.uid}"]


def with_changed_source(pex: Path, out: Path) -> Path:
    """A copy of the PEX whose calcx/agent/__init__.py has one more line."""
    with zipfile.ZipFile(pex) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        names = src.namelist()
        assert CHANGED_SOURCE in names, f"{CHANGED_SOURCE} not in the PEX: {names[:20]}"
        for info in src.infolist():
            data = src.read(info)
            if info.filename == CHANGED_SOURCE:
                data += b"# changed\n"
            dst.writestr(info, data)
    return out


def test_a_changed_source_file_changes_the_image_id(first: Built, agent_pex: Path, base_image: str, epoch: int,
                                                   tmp_path: Path) -> None:
    changed = build(AGENT, with_changed_source(agent_pex, tmp_path / "agent.pex"), base_image, epoch)
    assert changed.image_id != first.image_id
    assert changed.layer_diff_id != first.layer_diff_id
    found = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "/opt/agent/bin/python",
                            changed.image_id, "-c", "import calcx.agent, inspect; print(inspect.getsource(calcx.agent))"],
                           capture_output=True, text=True, timeout=120, check=True).stdout
    assert found.endswith("# changed\n\n")
