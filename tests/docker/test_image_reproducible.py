"""The agent image is reproducible: built twice from the same PEX and base, each time in a new
container into a new directory (the builder keeps no cache), it gets the same image ID; built
with one changed source file, it gets another one. CI runs this on every change.
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from calcx.image.build import Built, build
from calcx.image.recipes import AGENT, DOCKER_DIR

SELFTEST = "/opt/calcx/selftest.py"


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


def test_a_changed_source_file_changes_the_image_id(first: Built, agent_pex: Path, base_image: str, epoch: int,
                                                   tmp_path: Path) -> None:
    """The image's self-test script (src/docker/agent/selftest.py, copied to /opt/calcx) with one
    more line: another layer, another image ID, and the changed file inside."""
    changed_script = tmp_path / "selftest.py"
    changed_script.write_bytes((DOCKER_DIR / AGENT.files[SELFTEST]).read_bytes() + b"# changed\n")
    recipe = dataclasses.replace(AGENT, files={SELFTEST: str(changed_script)})
    changed = build(recipe, agent_pex, base_image, epoch)
    assert changed.layer_diff_id != first.layer_diff_id
    assert changed.image_id != first.image_id
    inside = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "cat", changed.image_id,
                             SELFTEST], capture_output=True, text=True, timeout=120, check=True).stdout
    assert inside.endswith("# changed\n")
