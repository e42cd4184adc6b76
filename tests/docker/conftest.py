"""The image tests get the agent image as Pants builds it (src/docker:agent, a docker-archive) and
the agent PEX it holds, both packaged for them (runtime_package_dependencies), and build the image
again with calcx.image over the base image that src/docker/base/build-base.sh made
($CALCX_BASE_IMAGE, default calcx/base:bookworm-py311)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from calcx.image.build import base_epoch
from calcx.image.recipes import DEFAULT_BASE

# where runtime_package_dependencies puts src/python/calcx/agent:agent and src/docker:agent
AGENT_PEX = Path("src.python.calcx.agent/agent.pex")
AGENT_ARCHIVE = Path("src.docker/agent-image.tar")


def _docker_reachable() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return (
            subprocess.run(
                ["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, timeout=15
            ).returncode
            == 0
        )
    except subprocess.TimeoutExpired:
        return False


@pytest.fixture(scope="session", autouse=True)
def docker_daemon() -> None:
    if not _docker_reachable():
        pytest.skip(reason="docker daemon not reachable")


@pytest.fixture(scope="session")
def base_image(docker_daemon: None) -> str:
    base = os.environ.get("CALCX_BASE_IMAGE") or DEFAULT_BASE
    if subprocess.run(["docker", "image", "inspect", base], capture_output=True, timeout=30).returncode != 0:
        pytest.fail(f"base image {base} is not in the local Docker daemon; build it with src/docker/base/build-base.sh")
    return base


@pytest.fixture(scope="session")
def agent_pex() -> Path:
    if not AGENT_PEX.is_file():
        pytest.fail(f"{AGENT_PEX} missing: run these tests through Pants, which packages the agent PEX first")
    return AGENT_PEX


@pytest.fixture(scope="session")
def agent_archive() -> Path:
    if not AGENT_ARCHIVE.is_file():
        pytest.fail(f"{AGENT_ARCHIVE} missing: run these tests through Pants, which packages src/docker:agent first")
    return AGENT_ARCHIVE


@pytest.fixture(scope="session")
def epoch(base_image: str) -> int:
    """The base image's SOURCE_DATE_EPOCH, which the Pants image targets date their images at."""
    return base_epoch(base_image)
