"""One token cannot starve the server: each endpoint reads at most its own body limit (an event a
few KiB, the gateway's calls more), refused (413) from Content-Length before any of the body is
read, or as soon as a body without one passes it; many concurrent oversized posts with one token
are all refused without being stored while the controller is served; and past
`max_connections` the HTTP server answers 503 at once."""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from calcx.api.client import CalcxClient
from calcx.server.serve import ServerThread, start_server_thread
from calcx.server.settings import DEFAULTS

ROW = {"question": "q", "result": "4"}
EVENT_LIMIT = DEFAULTS.max_event_body_bytes


@pytest.fixture
def srv(tmp_path: Path, server_key: str) -> Iterator[ServerThread]:
    thread = start_server_thread(str(tmp_path / "limits.db"), server_key)
    try:
        yield thread
    finally:
        thread.stop()


def claimed(srv: ServerThread, key: str, rid: str) -> tuple[str, str]:
    with CalcxClient(srv.url, key) as client:
        client.create_rollouts([{"rollout_id": rid, "row": ROW}])
        claim = client.claim("ctl", 1, timeout_s=2).claims[0]
    return claim.attempt_id, claim.token


def test_an_event_body_past_its_endpoints_limit_is_413_while_the_gateway_takes_more(
    srv: ServerThread, server_key: str, upstream: Any
) -> None:
    aid, token = claimed(srv, server_key, "sizes")
    auth = {"Authorization": f"Bearer {token}"}
    base = f"{srv.url}/v1/rollouts/sizes/attempts/{aid}"
    event = {"event_type": "log", "data": {"x": "y" * EVENT_LIMIT}}
    refused = httpx.post(f"{base}/events", headers=auth, json=event)
    assert refused.status_code == 413, refused.text
    error = refused.json()["error"]
    assert error["code"] == "body_too_large"
    assert f"at most {EVENT_LIMIT} bytes (--max-event-body-bytes)" in error["message"], error
    assert (
        httpx.post(f"{base}/events", headers=auth, json={"event_type": "log", "data": {"x": "y" * 1000}}).status_code
        == 200
    )
    with CalcxClient(srv.url, server_key) as client:
        client.put_models("m", [upstream.url])
        call = httpx.post(
            f"{base}/v1/chat/completions",
            headers=auth,
            timeout=30,
            json={"messages": [{"role": "user", "content": "z " * EVENT_LIMIT}]},
        )
        assert call.status_code == 200, call.text  # a long prompt is no event
        assert len(client.get_rollout("sizes").events) == 1


def test_a_declared_body_past_the_limit_is_refused_before_any_of_it_is_read(
    srv: ServerThread, server_key: str, raw_post: Callable[..., bytes]
) -> None:
    aid, token = claimed(srv, server_key, "declared")
    base = f"/v1/rollouts/declared/attempts/{aid}"
    for path, length in (
        (f"{base}/events", 10 * 2**20),
        (f"{base}/v1/chat/completions", DEFAULTS.max_body_bytes + 1),
        ("/v1/rollouts", 100 * 2**20),
    ):
        answer = raw_post(srv, path, server_key if path == "/v1/rollouts" else token, f"Content-Length: {length}\r\n")
        assert answer.startswith(b"HTTP/1.1 413") and b"body_too_large" in answer, (path, answer[:300])
    # without a Content-Length: read until it passes the limit, refused there, not at its end
    chunk = b"x" * 16384
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(EVENT_LIMIT // len(chunk) + 2))
    answer = raw_post(srv, f"{base}/events", token, "Transfer-Encoding: chunked\r\n", chunks)
    assert answer.startswith(b"HTTP/1.1 413") and b"body_too_large" in answer, answer[:300]


def test_many_concurrent_oversized_events_with_one_token_are_refused_and_the_controller_is_served(
    srv: ServerThread, server_key: str
) -> None:
    aid, token = claimed(srv, server_key, "flood")
    url = f"{srv.url}/v1/rollouts/flood/attempts/{aid}/events"
    body = b'{"event_type": "log", "data": {"x": "' + b"y" * 2**20 + b'"}}'  # 1 MiB: under the old 8 MiB limit

    def post(_: int) -> tuple[int, str]:
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
            resp = http.post(url, content=body)
        return resp.status_code, resp.json()["error"]["code"]

    with ThreadPoolExecutor(max_workers=32) as pool, CalcxClient(srv.url, server_key) as client:
        flood = [pool.submit(post, i) for i in range(64)]
        for _ in range(5):  # the controller's heartbeat is answered meanwhile
            assert [(h.rollout_id, h.attempt_id) for h in client.heartbeat("ctl").held] == [("flood", aid)]
        answers = Counter(f.result() for f in flood)
        assert set(answers) <= {(413, "body_too_large"), (429, "too_many_requests")}, answers
        assert answers[(413, "body_too_large")] >= 1
        assert client.get_rollout("flood").events == []  # nothing of the flood was stored
        client.post_reward("flood", aid, 1.0)  # and the attempt itself still works
        assert client.get_rollout("flood").reward == 1.0


def test_past_max_connections_the_server_answers_503_at_once(tmp_path: Path, server_key: str) -> None:
    srv = start_server_thread(str(tmp_path / "conns.db"), server_key, max_connections=8)
    idle: list[socket.socket] = []
    try:
        assert httpx.get(f"{srv.url}/healthz").status_code == 200
        idle = [socket.create_connection((srv.host, srv.port), timeout=10) for _ in range(10)]
        busy = httpx.get(f"{srv.url}/healthz", timeout=10)
        assert busy.status_code == 503, busy.text
        for sock in idle:
            sock.close()
        idle = []
        answered = None
        for _ in range(200):  # the server notices the closed connections on its next loop turns
            answered = httpx.get(f"{srv.url}/healthz", timeout=10)
            if answered.status_code == 200:
                break
        assert answered is not None and answered.status_code == 200
    finally:
        for sock in idle:
            sock.close()
        srv.stop()
