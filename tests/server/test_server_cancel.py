"""The cancel API: the QUEUED and RUNNING attempts of a run (its label) or of given rollouts end
FAILED with reason cancelled_by_api; finished ones and other runs are left alone; a cancelled
running attempt is lost to its controller; a cancelled rollout is retried only when forced, while
an attempt a stopping controller cancelled is retried as any failure."""

from __future__ import annotations

import pytest

from calcx.api.client import CalcxAPIError, CalcxClient
from calcx.contract.failures import FailureReason
from calcx.contract.labels import RUN_LABEL, STEP_LABEL


def _create(client: CalcxClient, run: str, ids: list[str]) -> None:
    client.create_rollouts(
        [
            {"rollout_id": rid, "row": {"question": "q", "result": "1"}, "labels": {RUN_LABEL: run, STEP_LABEL: "1"}}
            for rid in ids
        ]
    )


def test_cancelling_a_run_ends_its_queued_and_running_attempts_only(client: CalcxClient) -> None:
    _create(client, "old", ["old-run", "old-done", "old-queued"])
    claims = {c.rollout.rollout_id: c for c in client.claim("ctl", 2, timeout_s=2).claims}
    assert set(claims) == {"old-run", "old-done"}
    client.post_event("old-done", "1", "reward", {"value": 1.0})
    client.finish("old-done", "1", "SUCCEEDED")
    _create(client, "new", ["new-queued"])

    cancelled = client.cancel(run="old")
    assert sorted((r.rollout_id, r.attempt_id) for r in cancelled) == [("old-queued", "1"), ("old-run", "1")]
    for rid in ("old-run", "old-queued"):
        rollout = client.get_rollout(rid)
        assert rollout.state == "FAILED" and rollout.attempts[-1].reason == "cancelled_by_api"
    assert client.get_rollout("old-done").state == "SUCCEEDED" and client.get_rollout("old-done").reward == 1.0
    assert client.get_rollout("new-queued").state == "QUEUED"
    # the cancelled running attempt is lost to its controller (its next heartbeat stops it) ...
    # (with the reason, so that it can count a cancel as one)
    lost = client.heartbeat("ctl", [("old-run", "1")]).lost
    assert [(r.rollout_id, r.reason) for r in lost] == [("old-run", "cancelled_by_api")]
    # ... and the next claim gets the new run's work, not the old run's leftovers
    assert [c.rollout.rollout_id for c in client.claim("ctl", 5, timeout_s=1).claims] == ["new-queued"]
    assert client.cancel(run="old") == []  # nothing left to cancel


def test_cancelling_rollouts_by_id(client: CalcxClient) -> None:
    _create(client, "r", ["a", "b", "c"])
    cancelled = client.cancel(rollout_ids=["a", "c", "missing"])
    assert [r.rollout_id for r in cancelled] == ["a", "c"]
    assert [client.get_rollout(rid).state for rid in ("a", "b", "c")] == ["FAILED", "QUEUED", "FAILED"]
    with pytest.raises(CalcxAPIError) as refused:  # its work was withdrawn: no silent revival
        client.retry("a")
    assert refused.value.status == 409 and "retry with force" in refused.value.message
    assert client.get_rollout("a").state == "FAILED"
    assert client.retry("a", force=True).state == "QUEUED"  # ... unless asked for


def test_an_attempt_a_stopping_controller_cancelled_is_retried_unforced(client: CalcxClient) -> None:
    _create(client, "r", ["stopped"])
    (claim,) = client.claim("ctl", 1, timeout_s=2).claims
    client.finish("stopped", claim.attempt_id, "FAILED", reason=FailureReason.CANCELLED, detail="controller stopped")
    assert client.retry("stopped").latest_attempt.state == "QUEUED"


def test_only_the_cancel_api_sets_its_reason(client: CalcxClient) -> None:
    """A controller reporting cancelled_by_api would make work unretriable: refused."""
    _create(client, "r", ["x"])
    (claim,) = client.claim("ctl", 1, timeout_s=2).claims
    with pytest.raises(CalcxAPIError) as err:
        client.finish("x", claim.attempt_id, "FAILED", reason=FailureReason.CANCELLED_BY_API)
    assert err.value.status == 422 and "cancel API only" in err.value.message
    assert client.get_rollout("x").state == "RUNNING"


@pytest.mark.parametrize("body", [{}, {"run": "x", "rollout_ids": ["a"]}, {"rollout_ids": []}])
def test_a_cancel_must_name_one_target(client: CalcxClient, body: dict) -> None:
    with pytest.raises(CalcxAPIError) as err:
        client.cancel(**body)
    assert err.value.status == 422
