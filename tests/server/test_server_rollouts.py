"""Rollout life on a real server: create, get, list, idempotency, state changes, retries,
events, waits and the terminal cursor."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from calcx.api.client import CalcxAPIError, CalcxClient
from calcx.contract.failures import FailureReason


def spec(rid: str, i: int = 0, **extra: Any) -> dict[str, Any]:
    row = {"id": f"q{i}", "question": f"What is {i} + 1?", "chain": "", "result": str(i + 1), "source": "t"}
    return {"rollout_id": rid, "row": row, **extra}


def claim_one(client: CalcxClient, controller: str = "ctl") -> tuple[str, str]:
    claims = client.claim(controller, 1, timeout_s=2).claims
    assert len(claims) == 1
    return claims[0].rollout.rollout_id, claims[0].attempt_id


def test_create_get_list_and_group(client: CalcxClient) -> None:
    created = client.create_rollouts(
        [spec("a-1", 1, group_id="g1"), spec("a-2", 2, group_id="g1"), spec("a-3", 3, group_id="g2", labels={"k": "v"})]
    )
    assert [r.rollout_id for r in created] == ["a-1", "a-2", "a-3"]
    assert all(r.state == "QUEUED" and [a.attempt_id for a in r.attempts] == ["1"] for r in created)
    got = client.get_rollout("a-3")
    assert got.row["result"] == "4" and got.group_id == "g2" and got.labels == {"k": "v"}
    assert got.reward is None and got.events == []
    assert [r.rollout_id for r in client.list_rollouts(group_id="g1")] == ["a-1", "a-2"]
    assert [r.rollout_id for r in client.list_rollouts(state="QUEUED", limit=2, offset=1)] == ["a-2", "a-3"]
    assert client.list_rollouts(state="SUCCEEDED") == []


def test_create_is_idempotent_and_conflicting_body_changes_nothing(client: CalcxClient) -> None:
    first = client.create_rollout(spec("same", 1))
    again = client.create_rollout(spec("same", 1))
    assert again.created_at == first.created_at and again.attempts == first.attempts
    with pytest.raises(CalcxAPIError) as err:
        client.create_rollouts([spec("fresh", 5), spec("same", 2)])
    assert err.value.status == 409 and "same" in err.value.message
    # the batch was refused whole: "fresh" was not created
    with pytest.raises(CalcxAPIError) as missing:
        client.get_rollout("fresh")
    assert missing.value.status == 404
    with pytest.raises(CalcxAPIError) as twice:
        client.create_rollouts([spec("dup", 1), spec("dup", 2)])
    assert twice.value.status == 409


def test_env_map_must_name_row_fields(client: CalcxClient) -> None:
    with pytest.raises(CalcxAPIError) as err:
        client.create_rollout({"rollout_id": "noq", "row": {"text": "hi", "result": "1"}})
    assert err.value.status == 422 and "question" in err.value.message
    ok = client.create_rollout(
        {
            "rollout_id": "mapped",
            "row": {"text": "hi", "answer": 7},
            "env_map": {"QUESTION": "text", "RESULT": "answer"},
        }
    )
    assert ok.env_map == {"QUESTION": "text", "RESULT": "answer"}
    claim = client.claim("c", 1, timeout_s=1).claims[0]
    assert claim.env["QUESTION"] == "hi" and claim.env["RESULT"] == "7"


def test_a_claim_gets_the_env_map_its_rollout_was_created_with(client: CalcxClient) -> None:
    """An explicit env_map replaces the default one: the row's default fields (question, result,
    rel_tol) stay out of the agent's environment."""
    row = {"text": "hi", "answer": 7, "question": "other", "result": "9", "rel_tol": 0.5}
    client.create_rollout({"rollout_id": "own-map", "row": row, "env_map": {"QUESTION": "text", "RESULT": "answer"}})
    claim = client.claim("c", 1, timeout_s=1).claims[0]
    assert claim.rollout.env_map == {"QUESTION": "text", "RESULT": "answer"}
    assert {k: v for k, v in claim.env.items() if not k.startswith(("AGL_", "CALCX_"))} == {
        "QUESTION": "hi",
        "RESULT": "7",
    }


def test_state_changes_are_validated(client: CalcxClient) -> None:
    client.create_rollout(spec("s-1"))
    with pytest.raises(CalcxAPIError) as queued:
        client.finish("s-1", "1", "SUCCEEDED")
    assert queued.value.status == 409 and "QUEUED" in queued.value.message
    rid, aid = claim_one(client)
    done = client.finish(rid, aid, "SUCCEEDED", exit_code=0, agent_seconds=1.5)
    assert done.state == "SUCCEEDED" and done.attempts[0].agent_seconds == 1.5
    for state, reason in (("SUCCEEDED", None), ("FAILED", FailureReason.CRASH)):
        with pytest.raises(CalcxAPIError) as again:
            client.finish(rid, aid, state, reason=reason)
        assert again.value.status == 409
    with pytest.raises(CalcxAPIError) as retry:
        client.retry(rid)
    assert retry.value.status == 409 and "FAILED" in retry.value.message
    with pytest.raises(CalcxAPIError) as unknown_attempt:
        client.finish(rid, "7", "SUCCEEDED")
    assert unknown_attempt.value.status == 404


def test_failed_attempt_is_retried_up_to_max_attempts(client: CalcxClient) -> None:
    client.create_rollout(spec("f-1", max_attempts=2))
    rid, aid = claim_one(client)
    client.post_reward(rid, aid, 0.0)
    failed = client.finish(rid, aid, "FAILED", reason=FailureReason.MODEL_UNREACHABLE, exit_code=10, detail="boom")
    assert failed.state == "FAILED" and failed.attempts[0].reason == "model_unreachable"
    retried = client.retry(rid)
    assert retried.state == "QUEUED" and [a.attempt_id for a in retried.attempts] == ["1", "2"]
    assert retried.reward is None  # the reward belongs to the latest attempt only
    rid2, aid2 = claim_one(client)
    assert (rid2, aid2) == (rid, "2")
    client.post_reward(rid, "2", 1.0)
    client.finish(rid, "2", "FAILED", reason=FailureReason.TIMEOUT)
    with pytest.raises(CalcxAPIError) as exhausted:
        client.retry(rid)
    assert exhausted.value.status == 409 and "max_attempts=2" in exhausted.value.message
    final = client.get_rollout(rid)
    assert final.reward == 1.0 and [e.attempt_id for e in final.events] == ["1", "2"]


def test_events_reward_and_other_types(client: CalcxClient) -> None:
    client.create_rollout(spec("e-1"))
    rid, aid = claim_one(client)
    client.post_event(rid, aid, "tool_call", {"name": "calculator", "args": {"expr": "1+1"}})
    client.post_reward(rid, aid, 0.25)
    client.post_reward(rid, aid, 1)
    rollout = client.get_rollout(rid)
    assert rollout.reward == 1.0
    assert [e.event_type for e in rollout.events] == ["tool_call", "reward", "reward"]
    assert rollout.events[0].data == {"name": "calculator", "args": {"expr": "1+1"}}
    client.finish(rid, aid, "SUCCEEDED")
    with pytest.raises(CalcxAPIError) as late:
        client.post_reward(rid, aid, 1.0)
    assert late.value.status == 409
    with pytest.raises(CalcxAPIError) as unknown:
        client.post_reward("no-such-rollout", "1", 1.0)
    assert unknown.value.status == 404


def test_wait_returns_when_terminal_and_wakes_promptly(client: CalcxClient, server: Any, server_key: str) -> None:
    client.create_rollout(spec("w-1"))
    rid, aid = claim_one(client)
    timed_out = client.wait(rid, timeout_s=0.2)
    assert timed_out.state == "RUNNING"

    def finish_later() -> None:
        time.sleep(0.3)
        with CalcxClient(server.url, server_key) as other:
            other.finish(rid, aid, "SUCCEEDED")

    worker = threading.Thread(target=finish_later)
    worker.start()
    started = time.monotonic()
    done = client.wait(rid, timeout_s=10)
    waited = time.monotonic() - started
    worker.join(5)
    assert done.state == "SUCCEEDED"
    assert 0.25 <= waited < 1.5, f"wait took {waited:.2f}s"
    with pytest.raises(CalcxAPIError) as unknown:
        client.wait("nope", timeout_s=0.1)
    assert unknown.value.status == 404


def test_terminal_cursor_in_order_and_long_poll(client: CalcxClient, server: Any, server_key: str) -> None:
    client.create_rollouts([spec(f"t-{i}", i) for i in range(3)])
    claimed = client.claim("c", 3, timeout_s=1).claims
    assert len(claimed) == 3
    empty = client.terminal(after=0, timeout_s=0)
    assert empty.items == [] and empty.next == 0
    for c in reversed(claimed):
        client.finish(c.rollout.rollout_id, c.attempt_id, "SUCCEEDED")
    page = client.terminal(after=0, limit=2, timeout_s=0)
    assert [i.rollout.rollout_id for i in page.items] == ["t-2", "t-1"]
    rest = client.terminal(after=page.next, timeout_s=0)
    assert [i.rollout.rollout_id for i in rest.items] == ["t-0"] and rest.next > page.next

    client.create_rollout(spec("t-late"))
    rid, aid = claim_one(client)

    def finish_later() -> None:
        time.sleep(0.3)
        with CalcxClient(server.url, server_key) as other:
            other.finish(rid, aid, "FAILED", reason=FailureReason.CRASH)

    worker = threading.Thread(target=finish_later)
    worker.start()
    started = time.monotonic()
    woke = client.terminal(after=rest.next, timeout_s=10)
    waited = time.monotonic() - started
    worker.join(5)
    assert [i.rollout.rollout_id for i in woke.items] == ["t-late"] and woke.items[0].rollout.state == "FAILED"
    assert waited < 1.5, f"terminal long poll took {waited:.2f}s"
