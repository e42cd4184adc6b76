"""One attempt's caps hold under concurrency (calcx.server.budget): a model call is reserved before
it is forwarded, so hundreds of concurrent calls with one attempt token reach the upstream and the
store exactly up to the call cap, large concurrent calls stop at the byte cap, and a reservation
ends with its call however the call ends; and one token holds at most
`max_in_flight_per_attempt` requests at once (429 past it) while other attempts and the
controller are served."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from calcx.api.client import CalcxClient
from calcx.server.serve import ServerThread, start_server_thread

ROW = {"question": "q", "result": "4"}


@pytest.fixture
def start(tmp_path: Path, server_key: str) -> Iterator[Callable[..., ServerThread]]:
    threads: list[ServerThread] = []

    def run(**settings: Any) -> ServerThread:
        thread = start_server_thread(
            str(tmp_path / "budget.db"), server_key, upstream_backoff_s=0.01, upstream_timeout_s=30.0, **settings
        )
        threads.append(thread)
        return thread

    try:
        yield run
    finally:
        for thread in threads:
            thread.stop()


@contextmanager
def reading(server: ServerThread) -> Iterator[sqlite3.Connection]:
    """A second, read-only connection to the server's SQLite file (WAL: readers beside the writer)."""
    conn = sqlite3.connect(f"file:{server.app.state.calcx.settings.store_path}?mode=ro", uri=True)
    try:
        yield conn
    finally:
        conn.close()


def running(client: CalcxClient, *rids: str) -> dict[str, tuple[str, str]]:
    """Rollouts claimed: rid -> (attempt id, attempt token)."""
    client.create_rollouts([{"rollout_id": rid, "row": ROW} for rid in rids])
    claims = client.claim("ctl", len(rids), timeout_s=2).claims
    assert len(claims) == len(rids)
    return {c.rollout.rollout_id: (c.attempt_id, c.token) for c in claims}


async def call_all(url: str, token: str, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    """Every body sent at once, each on its own connection."""
    limits = httpx.Limits(max_connections=len(bodies), max_keepalive_connections=0)
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120, limits=limits) as http:
        return list(await asyncio.gather(*(http.post(url, json=body) for body in bodies)))


def codes(responses: list[httpx.Response]) -> Counter[tuple[int, str | None]]:
    return Counter((r.status_code, r.json()["error"]["code"] if r.status_code != 200 else None) for r in responses)


def wait_until(check: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.02)


def test_hundreds_of_concurrent_calls_with_one_token_stop_exactly_at_the_call_cap(
    start: Callable[..., ServerThread], server_key: str, upstream: Any
) -> None:
    cap, sent = 256, 400
    server = start(max_calls_per_attempt=cap, max_in_flight_per_attempt=1000)
    upstream.delay_s = 0.3  # the answers come after every call has been let in or refused
    with CalcxClient(server.url, server_key) as client:
        client.put_models("m", [upstream.url])
        aid, token = running(client, "burst")["burst"]
        url = f"{server.url}/v1/rollouts/burst/attempts/{aid}/v1/chat/completions"
        bodies = [{"model": "m", "messages": [{"role": "user", "content": f"call {i}"}]} for i in range(sent)]
        answers = asyncio.run(call_all(url, token, bodies))
        assert codes(answers) == {(200, None): cap, (413, "attempt_limit"): sent - cap}
        assert len(upstream.requests) == cap  # nothing past the cap was forwarded ...
        assert len(client.calls("burst")) == cap  # ... or recorded
        refused = next(r for r in answers if r.status_code == 413)
        assert f"at most {cap} calls" in refused.json()["error"]["message"]
    budgets = server.app.state.calcx.budgets
    assert budgets.held("burst", aid) == (0, 0, 0)  # every reservation ended with its call


def test_concurrent_large_calls_stop_at_the_byte_cap(
    start: Callable[..., ServerThread], server_key: str, upstream: Any, raw_post: Callable[..., bytes]
) -> None:
    cap = 1024 * 1024
    server = start(max_call_bytes_per_attempt=cap, max_in_flight_per_attempt=100)
    upstream.delay_s = 0.3
    with CalcxClient(server.url, server_key) as client:
        client.put_models("m", [upstream.url])
        aid, token = running(client, "large")["large"]
        url = f"{server.url}/v1/rollouts/large/attempts/{aid}/v1/chat/completions"
        bodies = [
            {"model": "m", "messages": [{"role": "user", "content": f"{i:02d} " + "x" * 100_000}]} for i in range(40)
        ]  # 4 MB in all against 1 MiB
        answers = asyncio.run(call_all(url, token, bodies))
        counted = codes(answers)
        assert set(counted) == {(200, None), (413, "attempt_limit")} and counted[(200, None)] >= 1
        recorded = client.calls("large")
        assert len(recorded) == counted[(200, None)] == len(upstream.requests)
        with reading(server) as db:
            request_bytes = db.execute("SELECT SUM(LENGTH(request)) FROM calls").fetchone()[0]
        assert request_bytes <= cap  # the requests let in fit in the cap; none was forwarded past it
        # a body declared larger than the bytes left is refused before any of it is sent
        answer = raw_post(
            server, f"/v1/rollouts/large/attempts/{aid}/v1/chat/completions", token, f"Content-Length: {2 * cap}\r\n"
        )
        assert answer.startswith(b"HTTP/1.1 413") and b"attempt_limit" in answer and b"Content-Length" in answer
    assert server.app.state.calcx.budgets.held("large", aid) == (0, 0, 0)


def test_a_reservation_ends_with_its_call_on_upstream_failure_and_when_the_agent_hangs_up(
    start: Callable[..., ServerThread], server_key: str, upstream: Any
) -> None:
    server = start(max_calls_per_attempt=3, upstream_retries=0)
    budgets = server.app.state.calcx.budgets
    with CalcxClient(server.url, server_key) as client:
        client.put_models("m", ["http://127.0.0.1:9/v1"])  # nothing listens: every call is a 502
        aid, token = running(client, "ends")["ends"]
        url = f"{server.url}/v1/rollouts/ends/attempts/{aid}/v1/chat/completions"
        auth = {"Authorization": f"Bearer {token}"}
        failed = httpx.post(url, headers=auth, json={"messages": [{"role": "user", "content": "a"}]}, timeout=30)
        assert failed.status_code == 502 and budgets.held("ends", aid) == (0, 0, 0)
        client.put_models("m", [upstream.url])
        release = threading.Event()
        upstream.before_answer = lambda: release.wait(30)
        with pytest.raises(httpx.ReadTimeout):  # the agent hangs up while its call is upstream
            httpx.post(url, headers=auth, json={"messages": [{"role": "user", "content": "b"}]}, timeout=0.5)
        wait_until(lambda: len(upstream.requests) == 1, "the call reached the upstream")
        assert budgets.held("ends", aid)[1] == 1  # still reserved: the call is still upstream
        release.set()
        wait_until(lambda: budgets.held("ends", aid) == (0, 0, 0), "the hung-up call's reservation ended")
        statuses = [c.status_code for c in client.calls("ends")]
        assert statuses == [502, 499]  # each ended call counts as recorded, in its reservation's place
        upstream.before_answer = None
        ok = httpx.post(url, headers=auth, json={"messages": [{"role": "user", "content": "c"}]}, timeout=30)
        assert ok.status_code == 200
        over = httpx.post(url, headers=auth, json={"messages": [{"role": "user", "content": "d"}]}, timeout=30)
        assert over.status_code == 413 and over.json()["error"]["code"] == "attempt_limit"


def test_one_token_holds_at_most_max_in_flight_requests_and_others_are_still_served(
    start: Callable[..., ServerThread], server_key: str, upstream: Any
) -> None:
    limit = 4
    server = start(max_in_flight_per_attempt=limit)
    release = threading.Event()
    upstream.before_answer = lambda: release.wait(30)
    with CalcxClient(server.url, server_key) as client:
        client.put_models("m", [upstream.url])
        attempts = running(client, "greedy", "other")
        aid, token = attempts["greedy"]
        base = f"{server.url}/v1/rollouts/greedy/attempts/{aid}"
        auth = {"Authorization": f"Bearer {token}"}

        def call(i: int) -> int:
            return httpx.post(
                f"{base}/v1/chat/completions",
                headers=auth,
                timeout=60,
                json={"messages": [{"role": "user", "content": f"hold {i}"}]},
            ).status_code

        with ThreadPoolExecutor(max_workers=limit) as pool:
            held = [pool.submit(call, i) for i in range(limit)]
            wait_until(lambda: len(upstream.requests) == limit, "every place taken by a call upstream")
            for refused in (
                httpx.post(f"{base}/events", headers=auth, json={"event_type": "log", "data": {}}),
                httpx.post(
                    f"{base}/v1/chat/completions",
                    headers=auth,
                    json={"messages": [{"role": "user", "content": "one more"}]},
                ),
            ):
                assert refused.status_code == 429, refused.text
                error = refused.json()["error"]
                assert error["code"] == "too_many_requests" and f"at most {limit} at once" in error["message"]
                assert refused.headers["retry-after"] == "1"
            # another attempt's token, and the controller, are served meanwhile
            other_aid, other_token = attempts["other"]
            other = httpx.post(
                f"{server.url}/v1/rollouts/other/attempts/{other_aid}/events",
                headers={"Authorization": f"Bearer {other_token}"},
                json={"event_type": "reward", "data": {"value": 1.0}},
            )
            assert other.status_code == 200
            assert client.heartbeat("ctl").held
            release.set()
            assert [f.result() for f in held] == [200] * limit
        # the places were given back
        assert httpx.post(f"{base}/events", headers=auth, json={"event_type": "log", "data": {}}).status_code == 200
        assert len(upstream.requests) == limit  # the refused call never reached the upstream
    assert server.app.state.calcx.budgets.held("greedy", aid) == (0, 0, 0)
