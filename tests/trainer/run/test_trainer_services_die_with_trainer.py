"""The server and controller `calcx train` starts die with it, even when it is killed with SIGKILL
(no cleanup runs then): a second start of the run finds no old controller claiming work from the
run's database. The controller runs with the agents' settings in its environment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from live_stack import SERVICES_PYTHON, alive, needs_services

pytestmark = needs_services

TRAINER = """
import sys, time
from pathlib import Path
from calcx.trainer.run.services import CALCX_SRC, LocalServices, ServicesConfig
python = sys.argv[2]
services = LocalServices(ServicesConfig(workdir=Path(sys.argv[1]), services_python=python,
                                        services_pythonpath=[str(CALCX_SRC)], agent_python=python,
                                        agent_pythonpath=[str(CALCX_SRC)], concurrency=2, tool_rounds=3,
                                        prompt="calculator-first")).start()
print(services.server.pid, services.controller.pid, flush=True)
time.sleep(600)
"""


def test_a_sigkilled_trainer_leaves_no_server_or_controller(tmp_path: Path) -> None:
    # the trainer's own credentials, which its services must not inherit
    credentials = {"WANDB_API_KEY": "wandb-secret", "HF_TOKEN": "hf-secret", "AWS_SECRET_ACCESS_KEY": "aws-secret"}
    env = {**os.environ, **credentials, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(tmp_path), SERVICES_PYTHON], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert trainer.stdout is not None
        pids = [int(p) for p in trainer.stdout.readline().split()]
        assert len(pids) == 2 and all(alive(p) for p in pids)
        # what its agents inherit (calcx.contract.env.AGENT_INHERITED_NAMES): calcx.agent_tool_rounds, agent_prompt
        controller_env = Path(f"/proc/{pids[1]}/environ").read_bytes().split(b"\0")
        assert (
            b"CALCX_AGENT_TOOL_ROUNDS=3" in controller_env and b"CALCX_AGENT_PROMPT=calculator-first" in controller_env
        )
        # their environment is the allowlist of calcx.contract.env.service_base_env, plus the key
        for pid in pids:
            names = {
                item.split(b"=", 1)[0].decode()
                for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                if item
            }
            assert not names & set(credentials), names & set(credentials)
            assert {"CALCX_KEY", "PATH", "PYTHONPATH"} <= names
        # the store and its WAL are the owner's alone
        for name in ("calcx.db", "calcx.db-wal"):
            assert (tmp_path / name).stat().st_mode & 0o777 == 0o600, name
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(timeout=30)
    deadline = time.monotonic() + 20
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in pids if alive(p)]
    for pid in left:  # (only when the test fails) end what this test started, by id
        os.kill(pid, signal.SIGKILL)
    assert left == [], "the server or controller outlived the killed trainer"
