"""What goes into the agent and controller images: one recipe each, the only copy of these facts.

A recipe names the PEX's venv path, the numeric user the image runs as (written into passwd and
group, no `useradd`), the entrypoint, the files it adds, the import check that must pass while
the venv is built, and the self-test that must pass in the finished image before it is tagged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from calcx import __version__
from calcx.contract.images import AGENT_UID, CONTROLLER_UID

# src/docker/<name>/ holds each image's extra files (the agent's MCP self-test).
DOCKER_DIR = Path(__file__).resolve().parents[3] / "docker"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_BASE = "calcx/base:bookworm-py311"


@dataclass(frozen=True)
class Recipe:
    name: str
    venv: str
    uid: int
    title: str
    description: str
    entrypoint: tuple[str, ...]
    import_check: str
    selftest: tuple[str, ...]  # arguments to the image's entrypoint, or a full argv with entry
    selftest_entrypoint: str | None = None
    selftest_expect: str = ""  # text its output must hold (besides exit 0)
    files: dict[str, str] = field(default_factory=dict)  # image path -> file under DOCKER_DIR

    def tags(self) -> tuple[str, ...]:
        return (f"calcx/{self.name}:{__version__}", f"calcx/{self.name}:latest")

    def env(self) -> tuple[str, ...]:
        return (
            "LANG=C.UTF-8",
            "PYTHONUNBUFFERED=1",
            "PYTHONDONTWRITEBYTECODE=1",
            f"PATH={self.venv}/bin:{SYSTEM_PATH}",
        )


AGENT = Recipe(
    name="agent",
    venv="/opt/agent",
    uid=AGENT_UID,
    title="calcx-agent",
    description="calcx Calc-X agent (AutoGen + MCP calculator), one rollout per run",
    entrypoint=("/opt/agent/bin/python", "-m", "calcx.agent"),
    import_check="import calcx.agent.main, calcx.agent.calculator, autogen_agentchat, mcp_server_calculator",
    # the MCP calculator must start over stdio, list `calculate` and answer 2+3 = 5
    selftest=("/opt/calcx/selftest.py",),
    selftest_entrypoint="/opt/agent/bin/python",
    selftest_expect="agent image self-test ok",
    files={"/opt/calcx/selftest.py": "agent/selftest.py"},
)

CONTROLLER = Recipe(
    name="controller",
    venv="/opt/calcx",
    uid=CONTROLLER_UID,
    title="calcx-controller",
    description="calcx controller: runs each rollout as a Kubernetes Job",
    entrypoint=("/opt/calcx/bin/python", "-m", "calcx.cli"),
    import_check=("import calcx.controller.k8s_cli, calcx.k8s.render, kubernetes; " "calcx.k8s.render.templates_dir()"),
    # the k8s runner's flags and the Job template must be inside
    selftest=("controller", "--runner", "k8s", "--help"),
    selftest_expect="--agent-image",
)

RECIPES = {recipe.name: recipe for recipe in (AGENT, CONTROLLER)}
