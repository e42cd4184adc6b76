"""A heartbeat whose answer crosses a finish report: the server already holds the attempt's result,
so it answers "lost", while the controller is still reporting it. Nothing is stopped, counted as
lost or logged as taken away; an attempt the server took away while it still ran is stopped."""

from __future__ import annotations

import asyncio
import logging

import pytest

from calcx.api.models import AttemptRef
from calcx.controller.controller import Controller
from calcx.controller.local_runner import LocalRunner


def test_a_heartbeat_crossing_a_finish_report_stops_nothing(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> tuple[bool, bool, int]:
        controller = Controller("http://127.0.0.1:9", "key", LocalRunner(agent_cmd=["true"], prefork=False),
                                controller_id="ctl")
        still_running = asyncio.create_task(asyncio.sleep(60))
        being_reported = asyncio.create_task(asyncio.sleep(60))
        controller._running[("r-run", "1")] = still_running
        controller._running[("r-done", "1")] = being_reported
        controller._reporting.add(("r-done", "1"))
        controller._stop_lost([AttemptRef(rollout_id="r-done", attempt_id="1"),
                               AttemptRef(rollout_id="r-run", attempt_id="1"),
                               AttemptRef(rollout_id="r-unknown", attempt_id="1")])
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
