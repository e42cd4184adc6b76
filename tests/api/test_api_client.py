"""The one client: both faces send the same requests, built from the endpoint table, and raise
one error type (httpx's MockTransport stands in for the server)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from calcx.api.client import AsyncCalcxClient, CalcxAPIError, CalcxClient
from calcx.api.endpoints import ENDPOINTS, GATEWAY_TIMEOUT_S, POLL_MARGIN_S

BASE = "http://calcx.test"
ROLLOUT = {
    "rollout_id": "r/1",
    "row": {"question": "q"},
    "state": "SUCCEEDED",
    "created_at": 1.0,
    "attempts": [{"attempt_id": "1", "state": "SUCCEEDED", "created_at": 1.0}],
    "reward": 1.0,
}
CALL = {
    "call_id": 1,
    "rollout_id": "r/1",
    "attempt_id": "1",
    "seq": 0,
    "request": {},
    "latency_s": 0.1,
    "status_code": 200,
    "created_at": 1.0,
    "prompt_token_ids": [1],
    "response_token_ids": [2],
    "response_logprobs": [-0.5],
}
LEASE = {"run": "run-1", "owner": "t-1", "lease_s": 30, "expires_at": 31.0, "acquired_at": 1.0, "renewed_at": 1.0}
REGISTRY = {"model": "m", "endpoints": ["http://h:1/v1"], "policy_version": 2, "updated_at": 1.0}

# Every client method with arguments, and the (method, path) it must reach.
CASES: list[tuple[str, tuple, dict, str, str]] = [
    ("health", (), {}, "GET", "/healthz"),
    ("metrics_text", (), {}, "GET", "/metrics"),
    ("create_rollouts", ([{"rollout_id": "r/1", "row": {}}],), {}, "POST", "/v1/rollouts"),
    ("create_rollout", ({"rollout_id": "r/1", "row": {}},), {}, "POST", "/v1/rollouts"),
    ("get_rollout", ("r/1",), {}, "GET", "/v1/rollouts/r%2F1"),
    ("list_rollouts", (), {"state": "FAILED", "limit": 5}, "GET", "/v1/rollouts"),
    ("wait", ("r/1",), {"timeout_s": 3}, "POST", "/v1/rollouts/r%2F1/wait"),
    ("retry", ("r/1",), {}, "POST", "/v1/rollouts/r%2F1/retry"),
    ("cancel", (), {"run": "run-1"}, "POST", "/v1/cancel"),
    ("record_trained", ("run-1", 3, ["r/1"]), {}, "POST", "/v1/trained"),
    ("rewind", ("run-1", 2), {}, "POST", "/v1/trained/rewind"),
    ("acquire_lease", ("run-1", "t-1"), {"take_over": True}, "POST", "/v1/leases"),
    ("renew_lease", ("run-1", "t-1"), {}, "POST", "/v1/leases/renew"),
    ("release_lease", ("run-1", "t-1"), {}, "POST", "/v1/leases/release"),
    ("calls", ("r/1",), {"attempt_id": "1"}, "GET", "/v1/rollouts/r%2F1/calls"),
    ("terminal", (), {"after": 4, "timeout_s": 2}, "GET", "/v1/terminal"),
    ("claim", ("c",), {"max": 2, "timeout_s": 1}, "POST", "/v1/claims"),
    ("heartbeat", ("c", [("r/1", "1")]), {}, "POST", "/v1/claims/heartbeat"),
    ("finish", ("r/1", "1", "FAILED"), {"reason": "crash"}, "POST", "/v1/rollouts/r%2F1/attempts/1/finish"),
    ("post_event", ("r/1", "1", "log", {"a": 1}), {}, "POST", "/v1/rollouts/r%2F1/attempts/1/events"),
    ("post_reward", ("r/1", "1", 0.5), {}, "POST", "/v1/rollouts/r%2F1/attempts/1/events"),
    (
        "chat_completions",
        ("r/1", "1", {"messages": []}),
        {},
        "POST",
        "/v1/rollouts/r%2F1/attempts/1/v1/chat/completions",
    ),
    ("openai_models", ("r/1", "1"), {}, "GET", "/v1/rollouts/r%2F1/attempts/1/v1/models"),
    ("put_models", ("m", ["http://h:1/v1"]), {"policy_version": 2}, "PUT", "/v1/models"),
    ("get_models", (), {}, "GET", "/v1/models"),
]


def answer(request: httpx.Request) -> httpx.Response:
    """A plausible 200 for every endpoint of the table."""
    path = request.url.path
    if path == "/healthz":
        return httpx.Response(200, json={"status": "ok", "version": "x"})
    if path == "/metrics":
        return httpx.Response(200, text="calcx_up 1\n", headers={"content-type": "text/plain"})
    if path.endswith("/events"):
        return httpx.Response(200, json={"event_id": 7})
    if path.endswith("/calls"):
        return httpx.Response(200, json={"calls": [CALL]})
    if path.endswith("/chat/completions") or path.endswith("/v1/models") and "attempts" in path:
        return httpx.Response(200, json={"object": "x"})
    if path == "/v1/models":
        return httpx.Response(200, json=REGISTRY)
    if path == "/v1/terminal":
        return httpx.Response(200, json={"items": [], "next": 4})
    if path == "/v1/claims":
        return httpx.Response(200, json={"claims": [], "lease_s": 30})
    if path == "/v1/cancel":
        return httpx.Response(200, json={"cancelled": [{"rollout_id": "r/1", "attempt_id": "1"}]})
    if path == "/v1/trained":
        return httpx.Response(200, json={"run": "run-1", "step": 3, "recorded": 1})
    if path == "/v1/trained/rewind":
        return httpx.Response(200, json={"run": "run-1", "after_step": 2, "rolled_back": [3, 4]})
    if path.startswith("/v1/leases"):
        return httpx.Response(200, json=LEASE)
    if path == "/v1/claims/heartbeat":
        return httpx.Response(200, json={"lease_s": 30, "held": [], "lost": []})
    if path == "/v1/rollouts":
        return httpx.Response(200, json={"rollouts": [ROLLOUT]})
    return httpx.Response(200, json=ROLLOUT)


def seen(log: list[httpx.Request]) -> Callable[[httpx.Request], httpx.Response]:
    def handler(request: httpx.Request) -> httpx.Response:
        log.append(request)
        return answer(request)

    return handler


def wire(request: httpx.Request) -> tuple[Any, ...]:
    return (
        request.method,
        str(request.url),
        request.content,
        request.headers.get("authorization"),
        request.headers.get("content-type"),
        request.extensions["timeout"]["read"],
    )


def run_sync(name: str, args: tuple, kwargs: dict, log: list[httpx.Request], key: str = "k") -> Any:
    with CalcxClient(BASE, key, transport=httpx.MockTransport(seen(log))) as client:
        return getattr(client, name)(*args, **kwargs)


def run_async(name: str, args: tuple, kwargs: dict, log: list[httpx.Request], key: str = "k") -> Any:
    async def go() -> Any:
        async with AsyncCalcxClient(BASE, key, transport=httpx.MockTransport(seen(log))) as client:
            return await getattr(client, name)(*args, **kwargs)

    return asyncio.run(go())


@pytest.mark.parametrize("name,args,kwargs,method,path", CASES, ids=[c[0] for c in CASES])
def test_both_faces_send_the_same_request_and_read_the_same_answer(name, args, kwargs, method, path) -> None:
    sync_log: list[httpx.Request] = []
    async_log: list[httpx.Request] = []
    sync_answer = run_sync(name, args, kwargs, sync_log)
    async_answer = run_async(name, args, kwargs, async_log)
    assert [wire(r) for r in sync_log] == [wire(r) for r in async_log]
    assert sync_answer == async_answer
    (request,) = sync_log
    assert (request.method, request.url.raw_path.decode().split("?")[0]) == (method, path)
    assert request.headers["authorization"] == "Bearer k"


def test_every_endpoint_of_the_table_has_a_method() -> None:
    reached = {(m, p) for _, _, _, m, p in CASES}
    for endpoint in ENDPOINTS:
        assert (endpoint.method, endpoint.path_for(rid="r/1", aid="1")) in reached, endpoint.name


def test_answers_are_typed_and_unwrapped() -> None:
    log: list[httpx.Request] = []
    assert run_sync("create_rollout", ({"rollout_id": "r/1", "row": {}},), {}, log).reward == 1.0
    assert [c.response_logprobs for c in run_sync("calls", ("r/1",), {}, log)] == [[-0.5]]
    assert run_sync("post_reward", ("r/1", "1", 1.0), {}, log) == 7
    assert json.loads(log[-1].content) == {"event_type": "reward", "data": {"value": 1.0}}
    assert run_sync("metrics_text", (), {}, log) == "calcx_up 1\n"
    assert run_sync("put_models", ("m", ["http://h:1/v1"]), {}, log).policy_version == 2
    assert run_sync("record_trained", ("run-1", 3, ["r/1"]), {}, log) == 1
    assert json.loads(log[-1].content) == {"run": "run-1", "step": 3, "rollout_ids": ["r/1"], "owner": None}
    assert run_sync("rewind", ("run-1", 2), {"owner": "t-1"}, log) == [3, 4]
    assert json.loads(log[-1].content) == {"run": "run-1", "after_step": 2, "owner": "t-1"}
    assert run_sync("acquire_lease", ("run-1", "t-1"), {}, log).owner == "t-1"
    assert json.loads(log[-1].content) == {"run": "run-1", "owner": "t-1", "take_over": False}
    run_sync("retry", ("r/1",), {"force": True}, log)
    assert json.loads(log[-1].content) == {"force": True}


def test_timeouts_follow_the_table() -> None:
    log: list[httpx.Request] = []
    run_sync("get_rollout", ("r",), {}, log)
    run_sync("wait", ("r",), {"timeout_s": 7}, log)
    run_sync("claim", ("c",), {"timeout_s": 0}, log)
    run_sync("terminal", (), {"timeout_s": 2}, log)
    run_sync("chat_completions", ("r", "1", {}), {}, log)
    assert [r.extensions["timeout"]["read"] for r in log] == [
        30.0,
        7 + POLL_MARGIN_S,
        POLL_MARGIN_S,
        2 + POLL_MARGIN_S,
        GATEWAY_TIMEOUT_S,
    ]


def test_all_rollouts_pages_through_the_list() -> None:
    def pages(request: httpx.Request) -> httpx.Response:
        offset, limit = int(request.url.params["offset"]), int(request.url.params["limit"])
        ids = [f"r{i}" for i in range(5)][offset : offset + limit]
        return httpx.Response(200, json={"rollouts": [{**ROLLOUT, "rollout_id": i} for i in ids]})

    with CalcxClient(BASE, "k", transport=httpx.MockTransport(pages)) as client:
        assert [r.rollout_id for r in client.all_rollouts(page=2)] == ["r0", "r1", "r2", "r3", "r4"]

    async def go() -> list[str]:
        async with AsyncCalcxClient(BASE, "k", transport=httpx.MockTransport(pages)) as client:
            return [r.rollout_id for r in await client.all_rollouts(page=5)]

    assert asyncio.run(go()) == ["r0", "r1", "r2", "r3", "r4"]


def test_error_answers_carry_status_code_message_and_request() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(401, json={"error": {"code": "unauthorized", "message": "unknown credentials"}})
        return httpx.Response(502, text="bad gateway")

    with CalcxClient(BASE, "k", transport=httpx.MockTransport(refuse)) as client:
        with pytest.raises(CalcxAPIError) as err:
            client.put_models("m", ["http://h:1/v1"])
        assert (err.value.status, err.value.code, err.value.message) == (401, "unauthorized", "unknown credentials")
        assert str(err.value) == f"calcx server: 401 unauthorized: unknown credentials (PUT {BASE}/v1/models)"
        assert not err.value.unreachable
        with pytest.raises(CalcxAPIError) as err:
            client.retry("r")
        assert (err.value.status, err.value.code, err.value.message) == (502, "http_error", "bad gateway")


def test_an_answer_that_is_not_the_model_is_an_error() -> None:
    with CalcxClient(BASE, "k", transport=httpx.MockTransport(lambda r: httpx.Response(200, json={"x": 1}))) as c:
        with pytest.raises(CalcxAPIError) as err:
            c.get_rollout("r")
    assert err.value.status == 200 and err.value.code == "bad_response" and "Rollout" in err.value.message


def test_unreachable_server_is_status_0_naming_the_request() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("All connection attempts failed", request=request)

    async def go() -> None:
        async with AsyncCalcxClient(BASE, "k", transport=httpx.MockTransport(down)) as client:
            await client.put_models("m", ["http://h:1/v1"])

    with pytest.raises(CalcxAPIError) as err:
        asyncio.run(go())
    assert err.value.status == 0 and err.value.code == "unreachable" and err.value.unreachable
    assert f"PUT {BASE}/v1/models" in str(err.value) and "ConnectError" in str(err.value)


def test_an_empty_key_sends_no_credentials() -> None:
    log: list[httpx.Request] = []
    run_async("get_models", (), {}, log, key="")
    assert "authorization" not in log[0].headers


def test_post_event_to_uses_the_url_the_server_handed_out() -> None:
    log: list[httpx.Request] = []
    url = "http://other.test:9/v1/rollouts/r/attempts/1/events"
    assert run_async("post_event_to", (url, "reward", {"value": 1.0}), {}, log, key="calcx-at.r.1.x") == 7
    assert str(log[0].url) == url and log[0].headers["authorization"] == "Bearer calcx-at.r.1.x"


def test_clients_share_one_tls_context_per_process_and_plain_http_trusts_no_certificate() -> None:
    import ssl

    from calcx.api.client import tls_context

    async def pools() -> list[Any]:
        clients = [AsyncCalcxClient(BASE, "k"), AsyncCalcxClient("https://calcx.test", "k")]
        try:
            return [c._http._transport._pool._ssl_context for c in clients]  # type: ignore[attr-defined]
        finally:
            await asyncio.gather(*(c.aclose() for c in clients))

    with CalcxClient(BASE, "k") as sync:
        sync_context = sync._http._transport._pool._ssl_context  # type: ignore[attr-defined]
    plain, secure = asyncio.run(pools())
    # every client of a process holds the same context: none builds (and loads CAs into) its own
    assert plain is sync_context is tls_context("http://elsewhere:1")
    assert secure is tls_context("https://elsewhere")
    # https verifies against the CA bundle; the plain-http context fails closed: no CA, so no
    # certificate passes
    assert secure.verify_mode == ssl.CERT_REQUIRED and secure.check_hostname
    assert secure.cert_store_stats()["x509_ca"] > 0
    assert plain.verify_mode == ssl.CERT_REQUIRED and plain.check_hostname
    assert plain.cert_store_stats()["x509_ca"] == 0
