"""The pre-forked worker (`python -m calcx.worker`) and its client (`ZygoteClient`): a worker that
dies is started again by its client, and the next agent runs in the new one."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from calcx.api.models import Claim, Rollout
from calcx.controller.base import RunResult
from calcx.controller.local_runner import LocalRunner
from calcx.worker.client import default_zygote_command
from calcx.worker.protocol import WORKER_MODULE


def claim(env: dict[str, str]) -> Claim:
    rollout = Rollout(
        rollout_id="r1", row={"question": "q", "result": "1"}, state="RUNNING", attempts=[], created_at=time.time()
    )
    return Claim(rollout=rollout, attempt_id="1", token="t", env=env, deadline_s=30.0)


def test_the_worker_command_is_the_worker_package() -> None:
    assert WORKER_MODULE == "calcx.worker" and default_zygote_command()[-2:] == ["-m", "calcx.worker"]


def test_a_dead_worker_is_restarted_and_the_agent_runs_in_it() -> None:
    async def go() -> tuple[RunResult, int, int | None, int | None]:
        runner = LocalRunner()
        await runner.start()
        try:
            assert runner.zygote is not None and runner.zygote.pid is not None
            first = runner.zygote.pid
            os.kill(first, signal.SIGKILL)
            await asyncio.wait_for(runner.zygote.proc.wait(), 10)  # type: ignore[union-attr]
            result = await runner.run(claim(env={"QUESTION": ""}))
            return result, runner.zygote.restarts, first, runner.zygote.pid
        finally:
            await runner.close()

    result, restarts, first, second = asyncio.run(go())
    # The agent ran (in a new worker) and refused the incomplete environment itself.
    assert (result.state, result.reason, result.exit_code) == ("FAILED", "bad_environment", 2)
    assert "QUESTION" in (result.detail or "")
    assert restarts == 1 and second != first
