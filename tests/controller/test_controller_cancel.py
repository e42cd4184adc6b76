"""A running attempt cancelled through the API is stopped by its controller, by id, at the next
heartbeat: the agent's run is cancelled, not left to run to its deadline, and its late result
does not overwrite the cancellation."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from calcx.api.client import CalcxClient
from calcx.api.models import Claim
from calcx.contract.labels import RUN_LABEL
from calcx.controller.base import RunResult
from calcx.controller.controller import Controller
from calcx.server.serve import start_server_thread

KEY = "controller-cancel-key-0123456789abcdef"


class _HangingRunner:
    """Runs until cancelled; says which attempts it was stopped on."""

    name = "hanging"

    def __init__(self) -> None:
        self.started: list[str] = []
        self.stopped: list[str] = []

    async def start(self) -> None:
        pass

    async def run(self, claim: Claim) -> RunResult:
        self.started.append(claim.rollout.rollout_id)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.stopped.append(claim.rollout.rollout_id)
            raise
        return RunResult.succeeded()

    async def close(self) -> None:
        pass


def test_a_cancelled_running_attempt_is_stopped_by_its_controller(tmp_path: Path) -> None:
    server = start_server_thread(str(tmp_path / "calcx.db"), KEY, lease_s=3.0)
    runner = _HangingRunner()
    try:
        with CalcxClient(server.url, KEY) as client:
            client.create_rollouts(
                [
                    {"rollout_id": rid, "row": {"question": "q", "result": "1"}, "labels": {RUN_LABEL: "old"}}
                    for rid in ("a", "b")
                ]
            )

        async def scenario() -> float:
            controller = Controller(server.url, KEY, runner, controller_id="ctl", concurrency=2, claim_timeout_s=1.0)
            task = asyncio.create_task(controller.run())
            while len(runner.started) < 2:
                await asyncio.sleep(0.05)
            started = time.monotonic()
            await asyncio.to_thread(lambda: CalcxClient(server.url, KEY).cancel(rollout_ids=["a"]))
            while "a" not in runner.stopped and time.monotonic() - started < 30:
                await asyncio.sleep(0.05)
            took = time.monotonic() - started
            assert runner.stopped == ["a"] and controller.running == 1  # b runs on
            # counted as what it is: cancelled (by the API), not lost
            assert (controller.stats.finished, controller.stats.lost) == ({"FAILED:cancelled_by_api": 1}, 0)
            controller.stop()
            await asyncio.wait_for(task, 30)
            return took

        took = asyncio.run(scenario())
        assert took < 10  # a heartbeat (every lease_s/3 = 1 s) after the cancel, with a margin
        with CalcxClient(server.url, KEY) as client:
            a = client.get_rollout("a")
            assert a.state == "FAILED" and a.attempts[-1].reason == "cancelled_by_api"
            assert "cancelled by rollout id" in (a.attempts[-1].detail or "")
    finally:
        server.stop()


class _SlowToStopRunner(_HangingRunner):
    """Hangs until cancelled, then takes `stop_s` to end its agent (a loaded machine, a slow exit)."""

    def __init__(self, stop_s: float) -> None:
        super().__init__()
        self.stop_s = stop_s

    async def run(self, claim: Claim) -> RunResult:
        self.started.append(claim.rollout.rollout_id)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(self.stop_s)
            self.stopped.append(claim.rollout.rollout_id)
            raise
        return RunResult.succeeded()


def test_a_controller_keeps_its_leases_until_its_shutdown_has_reported(tmp_path: Path) -> None:
    """Stopping a controller waits out a grace period and then its runners' own stops; the leases of
    the attempts still running must stay alive meanwhile, so that they end as cancelled by the
    controller, never as lost (controller_lost) to the server's lease reaper."""
    server = start_server_thread(str(tmp_path / "calcx.db"), KEY, lease_s=2.0)
    runner = _SlowToStopRunner(stop_s=5.0)  # 2.5 leases
    try:
        with CalcxClient(server.url, KEY) as client:
            client.create_rollouts([{"rollout_id": rid, "row": {"question": "q", "result": "1"}} for rid in ("a", "b")])

        async def scenario() -> None:
            controller = Controller(
                server.url, KEY, runner, controller_id="ctl", concurrency=2, claim_timeout_s=1.0, shutdown_grace_s=3.0
            )
            task = asyncio.create_task(controller.run())
            while len(runner.started) < 2:
                await asyncio.sleep(0.05)
            controller.stop()
            await asyncio.wait_for(task, 60)
            assert sorted(runner.stopped) == ["a", "b"]
            assert (controller.stats.finished, controller.stats.lost) == ({"FAILED:cancelled": 2}, 0)

        asyncio.run(scenario())
        with CalcxClient(server.url, KEY) as client:
            for rid in ("a", "b"):
                attempt = client.get_rollout(rid).attempts[-1]
                assert (attempt.state, attempt.reason) == ("FAILED", "cancelled"), attempt
    finally:
        server.stop()
