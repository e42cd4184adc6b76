"""A stop that lands while the server answers a claim: the server has moved the attempts to
RUNNING for this controller, whose cancelled request never reads the answer. The controller asks
which attempts the server counts as its own and ends the ones it never ran as cancelled, so none
sits RUNNING until its lease lapses (and then ends as controller_lost). What it ran itself is
never reported twice: not one that ends while the release is under way, not one whose report
the server never took."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import calcx.controller.controller as controller_module
from calcx.api import endpoints as api
from calcx.api.client import AsyncCalcxClient, CalcxClient
from calcx.api.errors import CalcxAPIError
from calcx.api.models import Claim, Rollout
from calcx.controller.base import RunResult
from calcx.controller.controller import Controller
from calcx.server.serve import start_server_thread

KEY = "stop-during-claim-key-0123456789abcdef"
LATE = "r-late"  # the rollout whose claim answer the stop loses


def row(rid: str) -> dict[str, Any]:
    return {"rollout_id": rid, "row": {"question": "q", "result": "1"}}


class _Runner:
    """Runs `r-run` until `release` is set (then succeeds); every other rollout succeeds at once."""

    name = "scripted"

    def __init__(self) -> None:
        self.runs: list[str] = []
        self.release = asyncio.Event()

    async def start(self) -> None:
        pass

    async def run(self, claim: Claim) -> RunResult:
        rid = claim.rollout.rollout_id
        self.runs.append(rid)
        if rid == "r-run":
            await self.release.wait()
        return RunResult.succeeded(agent_seconds=0.0)

    async def close(self) -> None:
        pass


def scenario(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    first: list[str],
    on_send: Callable[[Any, Any, Controller, _Runner], Any] | None = None,
    *,
    late: bool = True,
    answer_read: bool = False,
    lease_s: float = 600.0,
    **controller_kw: Any,
) -> tuple[Controller, _Runner, dict[str, Rollout]]:
    """`first` runs, then `r-late` is queued and the stop lands as its claim is answered: before
    the controller reads the answer (its request cancelled), or with `answer_read` just after.
    Without `late`, `on_send` stops the controller itself."""
    holder: dict[str, Any] = {}

    class AnsweredTooLate(AsyncCalcxClient):
        async def _send(self, call: Any) -> Any:
            if on_send is not None:
                await on_send(call, None, holder["controller"], holder["runner"])
            answer = await super()._send(call)
            if on_send is not None:
                await on_send(call, answer, holder["controller"], holder["runner"])
            if call.endpoint is api.CLAIM and any(c.rollout.rollout_id == LATE for c in answer.claims):
                if answer_read:  # the signal's handler runs as the answer comes back
                    asyncio.get_running_loop().call_soon(holder["controller"].stop)
                    return answer
                holder["controller"].stop()  # cancels this very request, as a signal would
                await asyncio.sleep(3600)
            return answer

    monkeypatch.setattr(controller_module, "AsyncCalcxClient", AnsweredTooLate)
    # a lease far longer than the test: only the controller's own release can end what it holds
    server = start_server_thread(str(tmp_path / "calcx.db"), KEY, lease_s=lease_s)

    async def main() -> None:
        runner = _Runner()
        controller = Controller(
            server.url, KEY, runner, controller_id="ctl", concurrency=4, claim_timeout_s=2.0, **controller_kw
        )
        holder.update(controller=controller, runner=runner)
        async with AsyncCalcxClient(server.url, KEY) as admin:
            await admin.create_rollouts([row(rid) for rid in first])
            running = asyncio.create_task(controller.run())
            # what ends at once has ended and been reported (or given up on); r-run runs on
            while late and (len(runner.runs) < len(first) or controller.running > first.count("r-run")):
                assert not running.done(), running
                await asyncio.sleep(0.01)
            if late:
                await admin.create_rollouts([row(LATE)])
            await asyncio.wait_for(running, 60)

    try:
        asyncio.run(main())
        with CalcxClient(server.url, KEY) as client:
            ended = {rid: client.get_rollout(rid) for rid in [*first, *([LATE] if late else [])]}
    finally:
        server.stop()
    return holder["controller"], holder["runner"], ended


def ended_as(rollout: Rollout) -> tuple[str, str | None]:
    return rollout.state, rollout.latest_attempt.reason


def test_attempts_claimed_as_the_controller_stops_end_cancelled_not_stranded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    controller, runner, ended = scenario(tmp_path, monkeypatch, first=["r-done"])
    assert runner.runs == ["r-done"]
    assert ended_as(ended["r-done"]) == ("SUCCEEDED", None)
    late = ended[LATE].latest_attempt
    assert ended_as(ended[LATE]) == ("FAILED", "cancelled") and late.controller_id == "ctl"
    assert "never ran it" in (late.detail or ""), late
    assert controller.stats.claimed == 2 and controller.stats.report_failures == 0
    assert controller.stats.finished == {"SUCCEEDED": 1, "FAILED:cancelled": 1}


def test_a_rollout_that_ends_during_the_release_is_reported_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """r-run ends (and leaves the running set) right after the server named what it holds."""

    async def end_run_when_asked(call: Any, answer: Any, controller: Controller, runner: _Runner) -> None:
        if answer is not None and call.endpoint is api.HEARTBEAT and "attempts" not in (call.body or {}):
            runner.release.set()
            while controller.running:
                await asyncio.sleep(0.01)

    controller, runner, ended = scenario(
        tmp_path, monkeypatch, first=["r-run"], on_send=end_run_when_asked, shutdown_grace_s=30.0
    )
    assert runner.runs == ["r-run"]
    assert ended_as(ended["r-run"]) == ("SUCCEEDED", None)  # its own end, within the grace
    assert ended_as(ended[LATE]) == ("FAILED", "cancelled")
    assert controller.stats.claimed == 2 and controller.stats.report_failures == 0
    assert controller.stats.finished == {"SUCCEEDED": 1, "FAILED:cancelled": 1}


def test_an_attempt_whose_report_was_not_taken_is_left_to_its_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server was unreachable for r-lost's report: it stays RUNNING there (until its lease
    lapses), and the release must not end it as an attempt this controller never ran."""
    late_claimed: list[str] = []

    async def refuse_its_report(call: Any, answer: Any, controller: Controller, runner: _Runner) -> None:
        if answer is not None and call.endpoint is api.CLAIM:
            late_claimed.extend(c.rollout.rollout_id for c in answer.claims if c.rollout.rollout_id == LATE)
        # the server is unreachable for r-lost's report, and back by the time of the stop
        if (
            answer is None
            and call.endpoint is api.FINISH
            and call.path_params.get("rid") == "r-lost"
            and not late_claimed
        ):
            raise CalcxAPIError(0, "unreachable", "connection refused", "POST finish")

    controller, runner, ended = scenario(
        tmp_path, monkeypatch, first=["r-lost"], on_send=refuse_its_report, report_timeout_s=0.2
    )
    assert runner.runs == ["r-lost"]
    assert ended_as(ended["r-lost"]) == ("RUNNING", None)
    assert ended_as(ended[LATE]) == ("FAILED", "cancelled")
    assert controller.stats.claimed == 2 and controller.stats.report_failures == 1
    assert controller.stats.finished == {"SUCCEEDED": 1, "FAILED:cancelled": 1}


def test_a_slow_release_does_not_hold_up_the_cancel_of_what_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The server does not answer the release's question: r-run is cancelled and reported at
    once all the same, the question gives up after its bound, and r-late is left to its lease."""
    monkeypatch.setattr(controller_module, "STOP_TIMEOUT_S", 1.0)
    seen: dict[str, float] = {}

    async def hang_the_question(call: Any, answer: Any, controller: Controller, runner: _Runner) -> None:
        if answer is None and call.endpoint is api.FINISH:
            seen.setdefault(f"finish {call.path_params['rid']}", time.time())
        if answer is None and call.endpoint is api.HEARTBEAT and "attempts" not in (call.body or {}):
            await asyncio.Event().wait()

    with caplog.at_level(logging.WARNING, logger="calcx.controller"):
        controller, runner, ended = scenario(tmp_path, monkeypatch, first=["r-run"], on_send=hang_the_question)
    gave_up = [r.created for r in caplog.records if "could not ask the server" in r.getMessage()]
    assert len(gave_up) == 1
    assert seen["finish r-run"] < gave_up[0]  # reported while the question still hung
    assert ended_as(ended["r-run"]) == ("FAILED", "cancelled")
    assert ended_as(ended[LATE]) == ("RUNNING", None)
    assert controller.stats.claimed == 1 and controller.stats.finished == {"FAILED:cancelled": 1}


def test_a_stop_just_after_the_answer_came_in_starts_none_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim's answer is in but unread when the stop's handler runs: nothing of it starts
    (a task cancelled before its first step could report nothing), and the controller ends what
    the answer named without asking the server what it holds."""
    asked: list[str] = []

    async def note_questions(call: Any, answer: Any, controller: Controller, runner: _Runner) -> None:
        if answer is None and call.endpoint is api.HEARTBEAT and "attempts" not in (call.body or {}):
            asked.append("held?")

    controller, runner, ended = scenario(
        tmp_path, monkeypatch, first=["r-done"], on_send=note_questions, answer_read=True
    )
    assert runner.runs == ["r-done"] and asked == []
    assert ended_as(ended[LATE]) == ("FAILED", "cancelled")
    assert "never ran it" in (ended[LATE].latest_attempt.detail or "")
    assert controller.stats.claimed == 2 and controller.stats.finished == {"SUCCEEDED": 1, "FAILED:cancelled": 1}


def test_an_attempt_the_server_took_back_during_the_grace_is_not_reported_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """r-run is cancelled through the API while the stop's grace runs; the heartbeat stops it
    and counts it once; its stop sends no report the server would refuse."""

    async def cancel_it_once_asked(call: Any, answer: Any, controller: Controller, runner: _Runner) -> None:
        if answer is not None and call.endpoint is api.HEARTBEAT and "attempts" not in (call.body or {}):
            async with AsyncCalcxClient(str(controller.server_url), KEY) as admin:
                await admin.cancel(rollout_ids=["r-run"])

    controller, runner, ended = scenario(
        tmp_path, monkeypatch, first=["r-run"], on_send=cancel_it_once_asked, lease_s=3.0, shutdown_grace_s=30.0
    )
    assert ended_as(ended["r-run"]) == ("FAILED", "cancelled_by_api")
    assert "cancelled by rollout id" in (ended["r-run"].latest_attempt.detail or "")
    assert ended_as(ended[LATE]) == ("FAILED", "cancelled")
    assert controller.stats.report_failures == 0 and controller.stats.lost == 0
    # r-run by the heartbeat (the API's cancel), r-late by the release (the controller's own)
    assert controller.stats.finished == {"FAILED:cancelled_by_api": 1, "FAILED:cancelled": 1}


def test_a_stop_during_a_rollouts_own_report_keeps_its_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stop lands while r-done's result is on its way: the result is taken, not lost to a
    cancel (which would leave the attempt RUNNING until its lease lapsed)."""

    async def stop_during_the_report(call: Any, answer: Any, controller: Controller, runner: _Runner) -> None:
        if answer is None and call.endpoint is api.FINISH and call.path_params.get("rid") == "r-done":
            controller.stop()
            await asyncio.sleep(0.3)  # the stop's cancels go out while this report is under way

    controller, runner, ended = scenario(
        tmp_path, monkeypatch, first=["r-done"], on_send=stop_during_the_report, late=False
    )
    assert ended_as(ended["r-done"]) == ("SUCCEEDED", None)
    assert controller.stats.report_failures == 0 and controller.stats.finished == {"SUCCEEDED": 1}


def test_a_release_report_the_server_does_not_answer_is_cut_at_its_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(controller_module, "STOP_TIMEOUT_S", 1.0)

    async def hang_the_late_report(call: Any, answer: Any, controller: Controller, runner: _Runner) -> None:
        if answer is None and call.endpoint is api.FINISH and call.path_params.get("rid") == LATE:
            await asyncio.Event().wait()

    controller, runner, ended = scenario(tmp_path, monkeypatch, first=["r-done"], on_send=hang_the_late_report)
    assert ended_as(ended[LATE]) == ("RUNNING", None)  # left to its lease
    assert controller.stats.report_failures == 1


def test_a_report_the_stop_gives_up_on_counts_as_a_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """r-done's report hangs past the stop's wait: it is cut, counted as a report failure, and
    the attempt, which the server still holds, is left to its lease (not ended as never run)."""
    monkeypatch.setattr(controller_module, "CANCEL_WARN_S", 0.5)

    async def hang_its_report(call: Any, answer: Any, controller: Controller, runner: _Runner) -> None:
        if answer is None and call.endpoint is api.FINISH and call.path_params.get("rid") == "r-done":
            controller.stop()
            await asyncio.Event().wait()

    controller, runner, ended = scenario(tmp_path, monkeypatch, first=["r-done"], on_send=hang_its_report, late=False)
    assert ended_as(ended["r-done"]) == ("RUNNING", None)
    assert controller.stats.report_failures == 1
