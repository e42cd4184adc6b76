"""A stop that lands while the server answers a claim: the server has moved the attempts to
RUNNING for this controller, whose cancelled request never reads the answer. The controller asks
which attempts the server counts as its own and ends the ones it never started as cancelled, so
none sits RUNNING until its lease lapses (and then ends as controller_lost)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import calcx.controller.controller as controller_module
from calcx.api import endpoints as api
from calcx.api.client import AsyncCalcxClient, CalcxClient
from calcx.api.models import Claim
from calcx.controller.base import RunResult
from calcx.controller.controller import Controller
from calcx.server.serve import start_server_thread

KEY = "stop-during-claim-key-0123456789abcdef"


class _NeverRunner:
    """Records what it was asked to run; nothing should reach it."""

    name = "never"

    def __init__(self) -> None:
        self.runs: list[str] = []

    async def start(self) -> None:
        pass

    async def run(self, claim: Claim) -> RunResult:
        self.runs.append(claim.rollout.rollout_id)
        return RunResult.succeeded(agent_seconds=0.0)

    async def close(self) -> None:
        pass


def test_attempts_claimed_as_the_controller_stops_end_cancelled_not_stranded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    holder: dict[str, Controller] = {}

    class AnsweredTooLate(AsyncCalcxClient):
        """The server answers the claim; the stop arrives before the controller reads it."""

        async def _send(self, call: Any) -> Any:
            answer = await super()._send(call)
            if call.endpoint is api.CLAIM and answer.claims:
                holder["controller"].stop()  # cancels this very request, as a signal would
                await asyncio.sleep(3600)
            return answer

    monkeypatch.setattr(controller_module, "AsyncCalcxClient", AnsweredTooLate)
    # a lease far longer than the test: only the controller's own release can end the attempts
    server = start_server_thread(str(tmp_path / "calcx.db"), KEY, lease_s=600.0)
    try:
        ids = ["r-1", "r-2"]
        with CalcxClient(server.url, KEY) as client:
            client.create_rollouts([{"rollout_id": rid, "row": {"question": "q", "result": "1"}} for rid in ids])
        runner = _NeverRunner()
        controller = Controller(server.url, KEY, runner, controller_id="ctl", concurrency=4, claim_timeout_s=2.0)
        holder["controller"] = controller
        asyncio.run(asyncio.wait_for(controller.run(), 60))
        with CalcxClient(server.url, KEY) as client:
            ended = {rid: client.get_rollout(rid) for rid in ids}
    finally:
        server.stop()
    assert runner.runs == []
    for rid, rollout in ended.items():
        attempt = rollout.latest_attempt
        assert (rollout.state, attempt.reason, attempt.controller_id) == ("FAILED", "cancelled", "ctl"), rid
        assert "never started" in (attempt.detail or ""), attempt
    assert controller.stats.claimed == 2 and controller.stats.finished == {"FAILED:cancelled": 2}
