"""The agent image is reproducible: the docker-archive Pants builds (src/docker:agent) and one
built here again from the same PEX and base, in a new container into a new directory (the builder
keeps no cache), are the same bytes, and `docker load -i` of Pants' archive gives that image ID;
built with one changed source file, the image gets another ID. CI runs this on every change.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from calcx.image.build import BuildError, Built, build, check_base_lock, load_archive
from calcx.image.recipes import AGENT, DOCKER_DIR

SELFTEST = "/opt/calcx/selftest.py"
LOCK = Path("src/docker/base/packages.lock")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@pytest.fixture(scope="module")
def rebuilt(
    agent_pex: Path, base_image: str, epoch: int, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Built, Path]:
    archive = tmp_path_factory.mktemp("rebuilt") / "agent-image.tar"
    return build(AGENT, agent_pex, base_image, epoch, archive=archive), archive


def test_the_pants_archive_and_a_rebuild_are_the_same_bytes(
    rebuilt: tuple[Built, Path], agent_archive: Path, epoch: int
) -> None:
    built, archive = rebuilt
    assert sha256(archive) == sha256(agent_archive)
    assert load_archive(agent_archive) == built.image_id
    inspected = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}} {{.Created}} {{.Config.User}}", AGENT.tags()[0]],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert inspected == [
        built.image_id,
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch)),
        f"{AGENT.uid}:{AGENT.uid}",
    ]


def test_a_changed_source_file_changes_the_image_id(
    rebuilt: tuple[Built, Path], agent_pex: Path, base_image: str, epoch: int, tmp_path: Path
) -> None:
    """The image's self-test script (src/docker/agent/selftest.py, copied to /opt/calcx) with one
    more line: another layer, another image ID, and the changed file inside."""
    first, _ = rebuilt
    changed_script = tmp_path / "selftest.py"
    changed_script.write_bytes((DOCKER_DIR / AGENT.files[SELFTEST]).read_bytes() + b"# changed\n")
    recipe = dataclasses.replace(AGENT, files={SELFTEST: str(changed_script)})
    changed = build(recipe, agent_pex, base_image, epoch)
    assert changed.layer_diff_id != first.layer_diff_id
    assert changed.image_id != first.image_id
    inside = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "cat", changed.image_id, SELFTEST],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert inside.endswith("# changed\n")


def test_a_base_made_from_another_package_set_is_refused(base_image: str, tmp_path: Path) -> None:
    """The image targets pass packages.lock; a base image made from another set fails the build."""
    check_base_lock(base_image, LOCK)
    lines = LOCK.read_text().splitlines(keepends=True)
    changed = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    lines[changed] = lines[changed].rstrip("\n") + "+changed\n"
    other = tmp_path / "packages.lock"
    other.write_text("".join(lines))
    with pytest.raises(BuildError, match="not made from the package set"):
        check_base_lock(base_image, other)


def test_the_archive_carries_every_layer_its_config_names(agent_archive: Path) -> None:
    """`docker load -i` of the archive needs no base image in the daemon: each diff ID of the
    config, the base's included, is a layer of the archive with exactly those bytes."""
    with tarfile.open(agent_archive, mode="r:") as tar:
        (entry,) = json.loads(_read(tar, "manifest.json"))
        diff_ids = json.loads(_read(tar, entry["Config"]))["rootfs"]["diff_ids"]
        assert len(diff_ids) == 2, "the base's layer and the image's own"
        assert [f"sha256:{hashlib.sha256(_read(tar, layer)).hexdigest()}" for layer in entry["Layers"]] == diff_ids


def _read(tar: tarfile.TarFile, name: str) -> bytes:
    member = tar.extractfile(name)
    assert member is not None, f"{name} missing from the archive"
    return member.read()
