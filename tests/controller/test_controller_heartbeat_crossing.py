"""A heartbeat whose answer crosses a finish report: the server already holds the attempt's result,
so it answers "lost", while the controller is still reporting it. Nothing is stopped, counted as
lost or logged as taken away; an attempt the server took away while it still ran is stopped."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from calcx.api.client import CalcxClient
from calcx.api.models import Claim, LostAttempt
from calcx.controller.base import RunResult
from calcx.controller.controller import Controller
from calcx.controller.local_runner import LocalRunner
from calcx.server.serve import start_server_thread

KEY = "heartbeat-crossing-key-0123456789abcdef"


def test_a_heartbeat_crossing_a_finish_report_stops_nothing(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> tuple[bool, bool, int]:
        controller = Controller(
            "http://127.0.0.1:9", "key", LocalRunner(agent_cmd=["true"], prefork=False), controller_id="ctl"
        )
        still_running = asyncio.create_task(asyncio.sleep(60))
        being_reported = asyncio.create_task(asyncio.sleep(60))
        controller._running[("r-run", "1")] = still_running
        controller._running[("r-done", "1")] = being_reported
        controller._reporting.add(("r-done", "1"))
        controller._stop_lost(
            [
                LostAttempt(rollout_id="r-done", attempt_id="1"),
                LostAttempt(rollout_id="r-run", attempt_id="1", reason="controller_lost"),
                LostAttempt(rollout_id="r-unknown", attempt_id="1"),
            ]
        )
        await asyncio.sleep(0)
        outcome = (still_running.cancelled(), being_reported.cancelled(), controller.stats.lost)
        being_reported.cancel()
        await asyncio.gather(still_running, being_reported, return_exceptions=True)
        return outcome

    with caplog.at_level(logging.INFO, logger="calcx.controller.controller"):
        run_cancelled, reported_cancelled, lost = asyncio.run(scenario())
    assert run_cancelled and not reported_cancelled and lost == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ["server says r-run/1 is no longer ours; stopping it"]


class _InstantRunner:
    """Finishes every attempt at once: what is under test is the report, not the run."""

    name = "instant"

    async def start(self) -> None:
        pass

    async def run(self, claim: Claim) -> RunResult:
        return RunResult.succeeded(agent_seconds=0.0)

    async def close(self) -> None:
        pass


class _CrossingController(Controller):
    """Heartbeats everything it runs right after the server took a result, as a heartbeat loop
    whose request crossed the finish would: the answer says "lost" for the attempt whose report
    is still under way."""

    crossed: list[tuple[str, str]] = []

    async def _report(self, rid: str, aid: str, result: RunResult, timeout_s: float) -> None:
        await super()._report(rid, aid, result, timeout_s)
        assert self._client is not None
        answer = await self._client.heartbeat(self.controller_id, list(self._running))
        self.crossed = [(ref.rollout_id, ref.attempt_id) for ref in answer.lost]
        self._stop_lost(answer.lost)
        await asyncio.sleep(0)  # where a cancel of this very task would land


def test_a_real_report_crossed_by_a_heartbeat_is_not_stopped_or_counted_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The controller's own bookkeeping (an attempt being reported is marked so) is what keeps the
    crossing harmless; nothing here fills that state by hand."""
    server = start_server_thread(str(tmp_path / "calcx.db"), KEY)
    try:
        with CalcxClient(server.url, KEY) as client:
            client.create_rollouts([{"rollout_id": "r-1", "row": {"question": "q", "result": "1"}}])
        controller = _CrossingController(
            server.url, KEY, _InstantRunner(), controller_id="ctl", max_rollouts=1, claim_timeout_s=2.0
        )
        with caplog.at_level(logging.INFO, logger="calcx.controller"):
            asyncio.run(asyncio.wait_for(controller.run(), 60))
        with CalcxClient(server.url, KEY) as client:
            assert client.get_rollout("r-1").state == "SUCCEEDED"
    finally:
        server.stop()
    assert controller.crossed == [("r-1", "1")]  # the heartbeat did cross the report
    assert controller.stats.lost == 0 and controller.stats.finished == {"SUCCEEDED": 1}
    assert not [r.getMessage() for r in caplog.records if "no longer ours" in r.getMessage()]
