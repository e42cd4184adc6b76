"""The cancel API: the QUEUED and RUNNING attempts of a run (its label) or of given rollouts end
FAILED with reason cancelled; finished ones and other runs are left alone; a cancelled running
attempt is lost to its controller."""

from __future__ import annotations

import pytest

from calcx.api.client import CalcxAPIError, CalcxClient
from calcx.contract.labels import RUN_LABEL, STEP_LABEL


def _create(client: CalcxClient, run: str, ids: list[str]) -> None:
    client.create_rollouts([{"rollout_id": rid, "row": {"question": "q", "result": "1"},
                             "labels": {RUN_LABEL: run, STEP_LABEL: "1"}} for rid in ids])


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
        assert rollout.state == "FAILED" and rollout.attempts[-1].reason == "cancelled"
    assert client.get_rollout("old-done").state == "SUCCEEDED" and client.get_rollout("old-done").reward == 1.0
    assert client.get_rollout("new-queued").state == "QUEUED"
    # the cancelled running attempt is lost to its controller (its next heartbeat stops it) ...
    # (with the reason, so that it can count a cancel as one)
    lost = client.heartbeat("ctl", [("old-run", "1")]).lost
    assert [(r.rollout_id, r.reason) for r in lost] == [("old-run", "cancelled")]
    # ... and the next claim gets the new run's work, not the old run's leftovers
    assert [c.rollout.rollout_id for c in client.claim("ctl", 5, timeout_s=1).claims] == ["new-queued"]
    assert client.cancel(run="old") == []  # nothing left to cancel


def test_cancelling_rollouts_by_id(client: CalcxClient) -> None:
    _create(client, "r", ["a", "b", "c"])
    cancelled = client.cancel(rollout_ids=["a", "c", "missing"])
    assert [r.rollout_id for r in cancelled] == ["a", "c"]
    assert [client.get_rollout(rid).state for rid in ("a", "b", "c")] == ["FAILED", "QUEUED", "FAILED"]
    assert client.retry("a").state == "QUEUED"  # a cancelled rollout can be run again


@pytest.mark.parametrize("body", [{}, {"run": "x", "rollout_ids": ["a"]}, {"rollout_ids": []}])
def test_a_cancel_must_name_one_target(client: CalcxClient, body: dict) -> None:
    with pytest.raises(CalcxAPIError) as err:
        client.cancel(**body)
    assert err.value.status == 422
