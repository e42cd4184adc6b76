"""Bad requests get a clear JSON error (code and message) and change nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from calcx.api.client import CalcxClient
from calcx.server.serve import start_server_thread
from calcx.server.settings import DEFAULTS

KEY = "errors-test-key-0123456789-abcdef"
LIMIT = 4096


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    thread = start_server_thread(str(tmp_path_factory.mktemp("err") / "calcx.db"), KEY, max_body_bytes=LIMIT)
    try:
        yield thread
    finally:
        thread.stop()


@pytest.fixture(scope="module")
def http(srv: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.url, headers={"authorization": f"Bearer {KEY}"}, timeout=10) as client:
        yield client


@pytest.fixture(scope="module")
def running(srv: Any) -> tuple[str, str]:
    with CalcxClient(srv.url, KEY) as client:
        client.create_rollout({"rollout_id": "run-1", "row": {"question": "q", "result": "1"}})
        claim = client.claim("c", 1, timeout_s=1).claims[0]
    return claim.rollout.rollout_id, claim.attempt_id


def error(resp: httpx.Response, status: int, code: str | None = None) -> str:
    assert resp.status_code == status, resp.text
    body = resp.json()["error"]
    assert set(body) == {"code", "message"} and body["message"]
    if code is not None:
        assert body["code"] == code, body
    return str(body["message"])


def test_malformed_json_is_422_with_position(http: httpx.Client) -> None:
    message = error(http.post("/v1/rollouts", content=b'{"rollouts": [ {"rollout_id": "x",, }]}'), 422, "invalid_json")
    assert "line 1 column" in message
    error(http.post("/v1/rollouts", content=b""), 422, "invalid_json")
    error(http.post("/v1/rollouts", content=b"\xff\xfe{"), 422, "invalid_json")
    error(http.post("/v1/rollouts", content=b"[1, 2]"), 422, "invalid_body")
    assert "NaN" in error(http.post("/v1/claims", content=b'{"controller_id": "c", "timeout_s": NaN}'), 422)


def test_schema_errors_name_the_field(http: httpx.Client) -> None:
    message = error(http.post("/v1/rollouts", json={"rollouts": [{"rollout_id": "bad id!", "row": {}}]}), 422)
    assert "rollouts.0.rollout_id" in message
    message = error(http.post("/v1/rollouts", json={"rollouts": [{"rollout_id": "r", "row": {}, "colour": 1}]}), 422)
    assert "colour" in message
    message = error(http.post("/v1/claims", json={"controller_id": "c", "max": 0}), 422)
    assert "max" in message
    message = error(http.get("/v1/rollouts", params={"limit": "lots"}), 422, "invalid_query")
    assert "limit" in message
    error(http.get("/v1/rollouts", params={"state": "DONE"}), 422, "invalid_query")
    error(http.get("/v1/terminal", params={"timeout_s": "-1"}), 422, "invalid_query")
    assert http.get("/v1/rollouts/r").status_code == 404  # nothing was created


def test_finish_reason_rules(http: httpx.Client, running: tuple[str, str]) -> None:
    rid, aid = running
    path = f"/v1/rollouts/{rid}/attempts/{aid}/finish"
    assert "reason" in error(http.post(path, json={"state": "FAILED"}), 422)
    assert "unknown failure reason" in error(http.post(path, json={"state": "FAILED", "reason": "oops"}), 422)
    error(http.post(path, json={"state": "SUCCEEDED", "reason": "crash"}), 422)
    error(http.post(path, json={"state": "RUNNING"}), 422)
    assert http.get(f"/v1/rollouts/{rid}").json()["state"] == "RUNNING"


def test_oversized_bodies_are_413_before_parsing(http: httpx.Client, running: tuple[str, str]) -> None:
    big = b'{"rollouts": [' + b" " * (LIMIT + 10) + b"]}"
    assert str(LIMIT) in error(http.post("/v1/rollouts", content=big), 413, "body_too_large")

    def chunks() -> Iterator[bytes]:  # no Content-Length: refused while streaming in
        for _ in range(10):
            yield b" " * 1024

    error(http.post("/v1/rollouts", content=chunks()), 413, "body_too_large")
    rid, aid = running
    error(http.post(f"/v1/rollouts/{rid}/attempts/{aid}/v1/chat/completions", content=big), 413)
    assert http.get("/v1/rollouts", params={"state": "QUEUED"}).json() == {"rollouts": []}


def test_unknown_things_are_404(http: httpx.Client, running: tuple[str, str]) -> None:
    assert "nope" in error(http.get("/v1/rollouts/nope"), 404, "not_found")
    error(http.post("/v1/rollouts/nope/wait", json={"timeout_s": 0}), 404)
    error(http.post("/v1/rollouts/nope/retry"), 404)
    error(http.get("/v1/rollouts/nope/calls"), 404)
    error(http.post("/v1/rollouts/nope/attempts/1/finish", json={"state": "SUCCEEDED"}), 404)
    error(http.post("/v1/rollouts/nope/attempts/1/events", json={"event_type": "reward", "data": {"value": 1}}), 404)
    rid, _ = running
    assert "attempt" in error(
        http.post(f"/v1/rollouts/{rid}/attempts/9/events", json={"event_type": "log", "data": {}}), 404
    )
    assert "no such endpoint" in error(http.get("/v1/nothing-here"), 404)
    error(http.delete("/v1/models"), 405, "method_not_allowed")


def test_bad_rewards_are_422_and_not_stored(http: httpx.Client, running: tuple[str, str]) -> None:
    rid, aid = running
    path = f"/v1/rollouts/{rid}/attempts/{aid}/events"
    for data in ({}, {"value": "1.0"}, {"value": None}, {"value": True}, {"value": [1]}):
        error(http.post(path, json={"event_type": "reward", "data": data}), 422, "invalid_reward")
    error(http.post(path, content=b'{"event_type": "reward", "data": {"value": Infinity}}'), 422, "invalid_json")
    assert "finite" in error(
        http.post(path, content=b'{"event_type": "reward", "data": {"value": 1e999}}'), 422, "invalid_reward"
    )
    for value in (1e39, -1e39, 1.0000001, -0.5):  # 1e39 passed once and turned an update into NaN
        assert "outside the reward range [0, 1]" in error(
            http.post(path, json={"event_type": "reward", "data": {"value": value}}), 422, "invalid_reward"
        )
    error(http.post(path, json={"event_type": "", "data": {}}), 422, "invalid_body")
    error(http.post(path, json={"event_type": "reward", "data": 3}), 422, "invalid_body")
    rollout = http.get(f"/v1/rollouts/{rid}").json()
    assert rollout["reward"] is None and rollout["events"] == []
    # unknown event types are data, not errors
    ok = http.post(path, json={"event_type": "my-custom-thing", "data": {"anything": [1, {"x": "y"}]}})
    assert ok.status_code == 200
    events = http.get(f"/v1/rollouts/{rid}").json()["events"]
    assert events[-1]["event_type"] == "my-custom-thing" and events[-1]["data"] == {"anything": [1, {"x": "y"}]}


def test_gateway_request_errors(http: httpx.Client, running: tuple[str, str]) -> None:
    rid, aid = running
    path = f"/v1/rollouts/{rid}/attempts/{aid}/v1/chat/completions"
    ok_body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    # no model registered yet: 503 that says what to do
    assert "PUT /v1/models" in error(http.post(path, json=ok_body), 503, "no_model")
    http.put("/v1/models", json={"model": "m", "endpoints": ["http://127.0.0.1:9/v1"]}).raise_for_status()
    assert "stream" in error(http.post(path, json={**ok_body, "stream": True}), 400, "stream_unsupported")
    error(http.post(path, json={"model": "m", "messages": []}), 400, "invalid_request")
    error(http.post(path, json={**ok_body, "n": 2}), 400, "invalid_request")
    error(http.post(path, json={**ok_body, "max_tokens": -5}), 400, "invalid_request")
    error(http.post(path, content=b"{not json"), 422, "invalid_json")
    bad_endpoint = http.put("/v1/models", json={"model": "m", "endpoints": ["ftp://x"]})
    assert "http(s)" in error(bad_endpoint, 422)


def nested(depth: int, leaf: str = "1") -> str:
    """JSON arrays nested `depth` deep around `leaf`."""
    return "[" * depth + leaf + "]" * depth


def test_json_nested_past_the_depth_limit_is_422_not_a_500(http: httpx.Client, running: tuple[str, str]) -> None:
    rid, aid = running
    events = f"/v1/rollouts/{rid}/attempts/{aid}/events"
    gateway = f"/v1/rollouts/{rid}/attempts/{aid}/v1/chat/completions"
    deep = DEFAULTS.max_json_depth
    # deeper than Python's parser can go (it raised RecursionError: a 500), and just past the limit
    for depth in (LIMIT // 2 - 10, deep + 1):
        for path in ("/v1/rollouts", "/v1/claims", events, gateway):
            body = f'{{"event_type": "log", "data": {{"x": {nested(depth - 2)}}}}}'.encode()
            if len(body) > LIMIT:
                body = nested(depth).encode()
            message = error(http.post(path, content=body), 422, "invalid_json")
            assert f"more than {deep} deep" in message, message
    # at the limit it is read (and stored: the attempt's own event data)
    at_limit = f'{{"event_type": "log", "data": {{"x": {nested(deep - 2)}}}}}'
    assert http.post(events, content=at_limit.encode()).status_code == 200
    assert http.get("/v1/rollouts", params={"state": "QUEUED"}).json() == {"rollouts": []}


def test_an_attempt_id_of_non_ascii_digits_is_404_not_a_500(http: httpx.Client, running: tuple[str, str]) -> None:
    rid, _ = running
    for aid in ("\u00b2", "\u0663", "\uff11"):  # superscript two, Arabic-Indic three, fullwidth one: isdigit() all
        path = f"/v1/rollouts/{rid}/attempts/{quote(aid)}"
        assert "no attempt" in error(http.post(f"{path}/events", json={"event_type": "log", "data": {}}), 404)
        error(http.post(f"{path}/finish", json={"state": "SUCCEEDED"}), 404, "not_found")
        error(http.post(f"{path}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}), 404)
        error(http.get(f"/v1/rollouts/{rid}/calls", params={"attempt_id": aid}), 404, "not_found")


def test_rollout_ids_that_are_dot_segments_are_refused(http: httpx.Client) -> None:
    for rid in (".", ".."):
        message = error(
            http.post(
                "/v1/rollouts", json={"rollouts": [{"rollout_id": rid, "row": {"question": "q", "result": "1"}}]}
            ),
            422,
            "invalid_body",
        )
        assert "dot segment" in message and "rollouts.0.rollout_id" in message, message
    created = http.post(
        "/v1/rollouts", json={"rollouts": [{"rollout_id": "...", "row": {"question": "q", "result": "1"}}]}
    )
    assert created.status_code == 200  # three dots are no path segment of their own
    assert http.get("/v1/rollouts/...").json()["rollout_id"] == "..."
