"""`calcx.agent_sandbox` reaches the controller `calcx train` starts as its `--sandbox` (the
controller owns the setting and checks it; the trainer only forwards it), and a sandboxed
controller starts under the config's default `prefork: true` and with the worker command the
trainer passes for an agent Python of its own (the sandbox spawns each agent)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from live_stack import SERVICES_PYTHON, needs_services
from omegaconf import OmegaConf

from calcx.trainer.run.services import CALCX_SRC, LocalServices, ServicesConfig

pytestmark = needs_services

PROBE = (
    "from calcx.controller.local_runner import default_agent_command as d; "
    "from calcx.controller.sandbox import NamespaceSandbox as N; "
    "N.plan(d(), dict(__import__('os').environ), default_agent=True).check()"
)


def _section(**settings: object) -> object:
    # the agent's import path apart from the services': the controller then gets --agent-cmd and
    # --worker-cmd, as on the GPU machine, where the agent has a Python and a path of its own
    paths = {
        "services_python": SERVICES_PYTHON,
        "agent_python": SERVICES_PYTHON,
        "services_pythonpath": [str(CALCX_SRC)],
        "agent_pythonpath": [str(CALCX_SRC), str(CALCX_SRC.parent)],
        "controller_concurrency": 1,
    }
    return OmegaConf.create({**paths, **settings})


def _controller_args(services: LocalServices) -> list[str]:
    assert services.controller is not None
    return Path(f"/proc/{services.controller.pid}/cmdline").read_bytes().decode().split("\0")


def test_agent_sandbox_is_the_started_controllers_sandbox(tmp_path: Path) -> None:
    probe = subprocess.run(
        [SERVICES_PYTHON, "-c", PROBE],
        env={**os.environ, "PYTHONPATH": str(CALCX_SRC)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    if probe.returncode != 0:
        pytest.skip(reason=f"namespaces are not available on this machine: {probe.stderr.strip()[-300:]}")
    config = ServicesConfig.from_calcx_section(_section(agent_sandbox="namespace", prefork=True), tmp_path / "on")
    with LocalServices(config) as services:
        args = _controller_args(services)
        assert args[args.index("--sandbox") + 1] == "namespace", args
        log = (services.workdir / "controller.log").read_text()
        assert "--worker-cmd" in args, args
        assert (
            "sandbox namespace: each agent is spawned in namespaces of its own (no pre-forked worker; "
            "--worker-cmd is not used)"
        ) in log, log
    default = ServicesConfig.from_calcx_section(_section(), tmp_path / "default")
    with LocalServices(default) as services:
        assert "--sandbox" not in _controller_args(services)
