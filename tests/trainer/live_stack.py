"""The real calcx parts for live trainer tests: which Python runs them, and a stub LLM process.

The server, controller, agent and stub LLM need the CPU service packages (fastapi,
prometheus-client, autogen, mcp, ...), which the trainer resolve does not hold: they run under
`$CALCX_SERVICES_PYTHON` (conftest.py points it at the `calcx` PEX's interpreter under Pants),
default /opt/calcx-dev/bin/python. Tests that need them are skipped, naming the variable, without.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from calcx.api.client import AsyncCalcxClient
from calcx.contract.ready import STUB_LLM_READY
from calcx.procs.managed import ManagedProcess
from calcx.trainer.run.services import CALCX_SRC

DEFAULT_SERVICES_PYTHON = "/opt/calcx-dev/bin/python"
SERVICES_PYTHON = os.environ.get("CALCX_SERVICES_PYTHON") or (
    DEFAULT_SERVICES_PYTHON if os.path.exists(DEFAULT_SERVICES_PYTHON) else ""
)

needs_services = pytest.mark.skipif(
    not SERVICES_PYTHON or not os.access(SERVICES_PYTHON, os.X_OK),
    reason="no Python with the CPU service packages: set CALCX_SERVICES_PYTHON "
    f"(default {DEFAULT_SERVICES_PYTHON} is absent)",
)


def start_stub(work: Path, rows: Sequence[dict[str, Any]], *extra: str) -> tuple[ManagedProcess, str]:
    """`python -m calcx.stub_llm` on a free port, scripted with `rows`; (process, OpenAI base URL)."""
    script = work / "stub-rows.jsonl"
    script.write_text("".join(json.dumps(r) + "\n" for r in rows))
    stub = ManagedProcess(
        "stub-llm",
        [SERVICES_PYTHON, "-m", "calcx.stub_llm", "--port", "0", "--script", str(script), *extra],
        work / "stub.log",
        {**os.environ, "PYTHONPATH": str(CALCX_SRC)},
    )
    stub.start(STUB_LLM_READY, 60)
    assert stub.match is not None
    return stub, stub.match.group(1).rstrip("/")


def eval_only(work: Path, model_url: str, val_file: Path, *overrides: str) -> subprocess.CompletedProcess:
    """`calcx train --eval-only --model-endpoint model_url` on `val_file`, its report in work/run:
    the command starts its own server and controller, their agents under SERVICES_PYTHON."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "calcx.trainer.run.cli",
            "--eval-only",
            "--model-endpoint",
            model_url,
            "--val-file",
            str(val_file),
            "--model",
            "calcx-stub",
            f"calcx.report_dir={work / 'run'}",
            f"calcx.services_python={SERVICES_PYTHON}",
            f"calcx.services_pythonpath=[{CALCX_SRC}]",
            f"calcx.agent_python={SERVICES_PYTHON}",
            f"calcx.agent_pythonpath=[{CALCX_SRC}]",
            "calcx.controller_concurrency=4",
            *overrides,
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=work,
        env={**os.environ, "PYTHONPATH": str(CALCX_SRC), "CUDA_VISIBLE_DEVICES": ""},
    )


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def start_server(work: Path, key: str, *extra: str) -> tuple[ManagedProcess, str]:
    """`python -m calcx.server` on a free port with a database in `work`; (process, URL)."""
    from calcx.contract.ready import SERVER_READY

    server = ManagedProcess(
        "calcx server",
        [
            SERVICES_PYTHON,
            "-m",
            "calcx.server",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--db",
            str(work / "calcx.db"),
            *extra,
        ],
        work / "server.log",
        {**os.environ, "PYTHONPATH": str(CALCX_SRC), "CALCX_KEY": key},
    )
    server.start(SERVER_READY, 60)
    assert server.match is not None
    return server, server.match.group(1).rstrip("/")


def agent_loop(cfg: Any) -> Any:
    """verl's CalcxAgentLoop as its worker makes it, without verl's tokenizer machinery: `run()`
    needs only the composed config."""
    from calcx.trainer.workers.calcx_agent_loop import CalcxAgentLoop

    loop = CalcxAgentLoop.__new__(CalcxAgentLoop)
    loop.config = cfg
    loop.rollout_config = cfg.actor_rollout_ref.rollout
    return loop


async def stack_rollouts(stack: dict) -> dict[str, dict]:
    """Every rollout the stack's server holds, by id, as JSON (what a test reads back after a run)."""
    client = AsyncCalcxClient(stack["services"].server_url, stack["services"].key)
    try:
        return {r.rollout_id: r.model_dump(mode="json") for r in await client.all_rollouts()}
    finally:
        await client.aclose()
