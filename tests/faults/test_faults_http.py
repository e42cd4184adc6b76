"""Hostile HTTP input against a real server: every endpoint answers the right 4xx, and a
refused request changes nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from calcx.api.client import CalcxClient
from calcx.api.tokens import attempt_token
from calcx.contract.failures import FailureReason
from calcx.faults.hostile import (
    FLOOD_EVENTS,
    KEY,
    MAX_BODY_BYTES,
    MAX_EVENT_BODY_BYTES,
    live_cases,
    ref_of,
    send,
    static_cases,
    summarize,
)
from calcx.faults.run import decoy_attempts
from calcx.server.serve import start_server_thread


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[Any]:
    srv = start_server_thread(
        str(tmp_path / "calcx.db"), KEY, max_body_bytes=MAX_BODY_BYTES, max_event_body_bytes=MAX_EVENT_BODY_BYTES
    )
    try:
        yield srv
    finally:
        srv.stop()


def snapshot(client: CalcxClient) -> dict[str, Any]:
    """What a refused request must not change: states, attempts, rewards, calls, the registry."""
    out: dict[str, Any] = {"models": client.get_models().model_dump()}
    for r in client.list_rollouts(limit=1000):
        out[r.rollout_id] = (
            r.state,
            r.reward,
            r.row,
            [(a.attempt_id, a.state, a.reason, a.controller_id) for a in r.attempts],
            [(e.event_type, e.data) for e in r.events if e.event_type == "reward"],
            len(client.calls(r.rollout_id)),
        )
    return out


def test_every_endpoint_refuses_hostile_requests_with_the_right_status(server: Any) -> None:
    with CalcxClient(server.url, KEY) as client:
        client.put_models("calcx-stub", ["http://127.0.0.1:9/v1"])
        decoy, finished = decoy_attempts(client, "t")
        cases = static_cases(KEY, decoy, finished)
        refusals = [c for c in cases if c.expect >= 400]
        assert {c.expect for c in refusals} >= {400, 401, 403, 404, 405, 409, 413, 422}
        before = snapshot(client)
        with httpx.Client(base_url=server.url, timeout=30) as http:
            outcomes = [send(http, c) for c in refusals]
        wrong = [
            f"{o.case.name}: want {o.case.expect} {o.case.code}, got {o.status} {o.code}" for o in outcomes if not o.ok
        ]
        assert wrong == []
        assert snapshot(client) == before


def test_error_answers_say_what_was_wrong(server: Any) -> None:
    with CalcxClient(server.url, KEY) as client:
        decoy, _ = decoy_attempts(client, "t")
    rid, aid, nonce = decoy
    token = {"Authorization": f"Bearer {attempt_token(KEY, rid, aid, nonce)}"}
    with httpx.Client(base_url=server.url, timeout=30) as http:
        broken = http.post(f"/v1/rollouts/{rid}/attempts/{aid}/events", headers=token, content=b'{"event_type": ')
        big = http.post(
            f"/v1/rollouts/{rid}/attempts/{aid}/events", headers=token, content=b"x" * (MAX_EVENT_BODY_BYTES + 1)
        )
        missing = http.get("/v1/rollouts")
    assert broken.status_code == 422 and "line 1 column" in broken.json()["error"]["message"]
    assert (
        big.status_code == 413
        and f"{MAX_EVENT_BODY_BYTES} bytes (--max-event-body-bytes)" in big.json()["error"]["message"]
    )
    assert missing.status_code == 401 and "Authorization: Bearer" in missing.json()["error"]["message"]


def test_unknown_events_are_stored_as_data_and_do_not_touch_the_reward(server: Any) -> None:
    with CalcxClient(server.url, KEY) as client:
        decoy, _ = decoy_attempts(client, "t")
        rid, aid, nonce = decoy
        client.post_reward(rid, aid, 1.0)
        with httpx.Client(base_url=server.url, timeout=30) as http:
            headers = {"Authorization": f"Bearer {attempt_token(KEY, rid, aid, nonce)}"}
            resp = http.post(
                f"/v1/rollouts/{rid}/attempts/{aid}/events",
                headers=headers,
                json={"event_type": "rew\u202eard", "data": {"value": 0.0, "nested": [{"a": None}]}},
            )
        assert resp.status_code == 200
        rollout = client.get_rollout(rid)
        assert rollout.reward == 1.0
        assert rollout.events[-1].event_type == "rew\u202eard"
        assert rollout.events[-1].data == {"value": 0.0, "nested": [{"a": None}]}


def test_cross_rollout_tokens_and_finished_rollouts_are_refused(server: Any) -> None:
    row = {"question": "What is 2 + 2?", "result": "4"}
    with CalcxClient(server.url, KEY) as client:
        client.put_models("calcx-stub", ["http://127.0.0.1:9/v1"])
        client.create_rollouts([{"rollout_id": f"x{i}", "row": row} for i in range(3)])
        claims = client.claim("test-controller", max=3, timeout_s=0).claims
        refs = [ref for c in claims if (ref := ref_of(c.rollout))]
        client.post_reward(*refs[2][:2], 1.0)
        client.finish(*refs[2][:2], "SUCCEEDED")
        before = snapshot(client)
        cases = live_cases(KEY, refs[:2], [refs[2]])
        assert {c.expect for c in cases} == {403, 409}
        with httpx.Client(base_url=server.url, timeout=30) as http:
            outcomes = [send(http, c) for c in cases]
        assert [o.case.name for o in outcomes if not o.ok] == []
        assert snapshot(client) == before
        assert client.get_rollout(refs[2][0]).reward == 1.0


def test_every_wrong_answer_is_counted_and_only_a_restart_excuses_no_answer(tmp_path: Path) -> None:
    """A decoy lost mid-run turns the whole event flood into 409s: each one is a wrong answer,
    listed with its count (none cut off). A request nobody answered is left out of the figure
    only when it overlapped a server restart; at any other time it is a wrong answer."""
    srv = start_server_thread(
        str(tmp_path / "calcx.db"), KEY, max_body_bytes=MAX_BODY_BYTES, max_event_body_bytes=MAX_EVENT_BODY_BYTES
    )
    try:
        with CalcxClient(srv.url, KEY) as client:
            decoy, finished = decoy_attempts(client, "t")
            cases = static_cases(KEY, decoy, finished)
            client.finish(*decoy[:2], "FAILED", reason=FailureReason.CANCELLED, detail="the decoy lost")
        flood = [c for c in cases if c.name == "event flood"]
        healthz = next(c for c in cases if c.name == "healthz is open")
        with httpx.Client(base_url=srv.url, timeout=10) as http:
            answered = [send(http, c) for c in flood]
    finally:
        down_at = time.time()
        srv.stop()
    with httpx.Client(base_url=srv.url, timeout=10) as http:
        unanswered = [send(http, healthz) for _ in range(3)]
    restart = (down_at, time.time())
    outcomes = answered + unanswered

    during = summarize(outcomes, [restart])
    assert during["wrong"] == [f"event flood: want 200 , got 409 conflict (x{FLOOD_EVENTS})"]
    assert (during["requests"], during["right"], during["skipped_server_down"]) == (FLOOD_EVENTS, 0, 3)

    outside = summarize(outcomes, [(restart[0] - 100, restart[0] - 50)])
    assert (outside["requests"], outside["right"], outside["skipped_server_down"]) == (FLOOD_EVENTS + 3, 0, 0)
    assert "healthz is open: want 200 , got no answer outside a restart (x3)" in outside["wrong"]
