"""Auth on every endpoint: no or unknown credentials 401, an attempt token outside its own
attempt's gateway and events URLs 403; /healthz and /metrics open."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from calcx.api.client import CalcxClient
from calcx.api.tokens import attempt_token, verify_attempt_token
from calcx.contract.failures import FailureReason

# (method, path, body) for every authenticated endpoint; {rid}/{aid} are filled per test.
SERVER_KEY_ONLY = [
    ("POST", "/v1/rollouts", {"rollouts": [{"rollout_id": "new", "row": {"question": "q", "result": "1"}}]}),
    ("GET", "/v1/rollouts", None),
    ("GET", "/v1/rollouts/{rid}", None),
    ("POST", "/v1/rollouts/{rid}/wait", {"timeout_s": 0}),
    ("POST", "/v1/rollouts/{rid}/retry", None),
    ("GET", "/v1/rollouts/{rid}/calls", None),
    ("GET", "/v1/terminal?timeout_s=0", None),
    ("POST", "/v1/claims", {"controller_id": "c", "max": 1, "timeout_s": 0}),
    ("POST", "/v1/claims/heartbeat", {"controller_id": "c"}),
    ("POST", "/v1/rollouts/{rid}/attempts/{aid}/finish", {"state": "SUCCEEDED"}),
    ("PUT", "/v1/models", {"model": "m", "endpoints": ["http://127.0.0.1:9/v1"]}),
    ("GET", "/v1/models", None),
]
ATTEMPT_SCOPED = [
    ("POST", "/v1/rollouts/{rid}/attempts/{aid}/events", {"event_type": "log", "data": {}}),
    ("POST", "/v1/rollouts/{rid}/attempts/{aid}/v1/chat/completions", {"model": "m", "messages": []}),
    ("GET", "/v1/rollouts/{rid}/attempts/{aid}/v1/models", None),
]
ALL = SERVER_KEY_ONLY + ATTEMPT_SCOPED


KEY = "test-server-key-0123456789-abcdef"  # the conftest key (module-scoped fixtures cannot take server_key)


@pytest.fixture(scope="module")
def server(shared_server: Any) -> Any:
    return shared_server


@pytest.fixture(scope="module")
def two_running(shared_server: Any) -> list[tuple[str, str, str]]:
    """Two RUNNING attempts: (rollout id, attempt id, the attempt's token from its claim)."""
    with CalcxClient(shared_server.url, KEY) as client:
        client.create_rollouts([{"rollout_id": r, "row": {"question": "q", "result": "1"}} for r in ("mine", "theirs")])
        claims = client.claim("c", 2, timeout_s=1).claims
    return [(c.rollout.rollout_id, c.attempt_id, c.token) for c in claims]


_HTTP: list[httpx.Client] = []


@pytest.fixture(scope="module", autouse=True)
def _http_client() -> Any:
    """One connection pool for the module (a fresh httpx client per request costs ~50 ms)."""
    with httpx.Client(timeout=10) as http:
        _HTTP.append(http)
        yield
        _HTTP.clear()


def _send(url: str, method: str, path: str, body: Any, headers: dict[str, str], rid: str, aid: str) -> httpx.Response:
    return _HTTP[0].request(method, url + path.format(rid=rid, aid=aid), json=body, headers=headers)


def _code(resp: httpx.Response) -> str:
    return resp.json()["error"]["code"]


@pytest.mark.parametrize("method,path,body", ALL, ids=[f"{m} {p}" for m, p, _ in ALL])
def test_missing_or_wrong_credentials_get_401(
    server: Any, two_running: list[tuple[str, str, str]], method: str, path: str, body: Any, server_key: str
) -> None:
    rid, aid, token = two_running[0]
    nonce = token.rsplit(".", 2)[1]
    forged = f"calcx-at.{rid}.{aid}.{nonce}." + "0" * 64
    for headers in (
        {},
        {"authorization": "Bearer not-the-key"},
        {"x-api-key": "not-the-key"},
        {"authorization": f"Bearer {forged}"},
        {"authorization": f"Bearer {attempt_token('another-key', rid, aid, nonce)}"},
        {"authorization": f"Bearer {attempt_token(server_key, rid, aid, 'a-nonce-never-drawn')}"},
        {"authorization": f"Basic {server_key}"},
        # the server key and anything that only starts like it
        {"authorization": f"Bearer {server_key[:16]}"},
        {"authorization": f"Bearer {server_key[:16] + 'x' * (len(server_key) - 16)}"},
        {"authorization": f"Bearer {server_key[:-1] + chr(ord(server_key[-1]) ^ 1)}"},
        {"x-api-key": server_key + "x"},
    ):
        resp = _send(server.url, method, path, body, headers, rid, aid)
        assert resp.status_code == 401, (headers, resp.text)
        assert _code(resp) == "unauthorized" and resp.headers.get("www-authenticate")


@pytest.mark.parametrize("method,path,body", SERVER_KEY_ONLY, ids=[f"{m} {p}" for m, p, _ in SERVER_KEY_ONLY])
def test_attempt_token_cannot_use_server_endpoints(
    server: Any, two_running: list[tuple[str, str, str]], method: str, path: str, body: Any, server_key: str
) -> None:
    rid, aid, token = two_running[0]
    resp = _send(server.url, method, path, body, {"authorization": f"Bearer {token}"}, rid, aid)
    assert resp.status_code == 403, resp.text
    assert _code(resp) == "forbidden" and "server key" in resp.json()["error"]["message"]


@pytest.mark.parametrize("method,path,body", ATTEMPT_SCOPED, ids=[f"{m} {p}" for m, p, _ in ATTEMPT_SCOPED])
def test_attempt_token_is_limited_to_its_own_attempt(
    server: Any, two_running: list[tuple[str, str, str]], method: str, path: str, body: Any, server_key: str
) -> None:
    (mine, aid, token), (theirs, their_aid, _) = two_running
    for headers in ({"authorization": f"Bearer {token}"}, {"x-api-key": token}):
        other_rollout = _send(server.url, method, path, body, headers, theirs, their_aid)
        assert other_rollout.status_code == 403, other_rollout.text
        assert theirs in other_rollout.json()["error"]["message"]
        other_attempt = _send(server.url, method, path, body, headers, mine, "2")
        assert other_attempt.status_code == 403, other_attempt.text


def test_attempt_token_works_on_its_own_urls_and_server_key_everywhere(
    server: Any, two_running: list[tuple[str, str, str]], server_key: str
) -> None:
    rid, aid, token = two_running[0]
    base = f"{server.url}/v1/rollouts/{rid}/attempts/{aid}"
    event = _HTTP[0].post(
        f"{base}/events",
        json={"event_type": "reward", "data": {"value": 1}},
        headers={"authorization": f"Bearer {token}"},
    )
    assert event.status_code == 200 and event.json()["event_id"] >= 1
    models = _HTTP[0].get(f"{base}/v1/models", headers={"x-api-key": token})
    assert models.status_code == 200 and models.json()["object"] == "list"
    admin = _HTTP[0].get(f"{server.url}/v1/rollouts/{rid}", headers={"x-api-key": server_key})
    assert admin.status_code == 200 and admin.json()["reward"] == 1.0


def test_open_endpoints(server: Any) -> None:
    health = _HTTP[0].get(f"{server.url}/healthz")
    assert health.status_code == 200 and health.json()["status"] == "ok" and health.json()["version"]
    metrics = _HTTP[0].get(f"{server.url}/metrics")
    assert metrics.status_code == 200 and "calcx_rollouts" in metrics.text


def test_tokens_round_trip_with_dots_in_ids() -> None:
    token = attempt_token("k", "uid.with.dots:3", "12", "5eed")
    scope = verify_attempt_token("k", token)
    assert scope is not None and (scope.rollout_id, scope.attempt_id, scope.nonce) == ("uid.with.dots:3", "12", "5eed")
    assert verify_attempt_token("other", token) is None
    assert verify_attempt_token("k", token[:-1] + ("0" if token[-1] != "0" else "1")) is None
    assert verify_attempt_token("k", "calcx-at.onlyone") is None
    assert verify_attempt_token("k", "k") is None


def test_a_token_of_a_deleted_rollout_does_not_open_its_namesake(tmp_path: Any) -> None:
    """Retention deletes a finished rollout; a new one is created under the same id and claimed.
    The first attempt's token (same rollout id, same attempt id) must not post the new one's reward."""
    from calcx.server.serve import start_server_thread

    server = start_server_thread(str(tmp_path / "calcx.db"), KEY, retain_s=0.01, retain_check_s=0.05)
    row = {"rollout_id": "again", "row": {"question": "q", "result": "1"}}
    reward = {"event_type": "reward", "data": {"value": 1.0}}
    try:
        with CalcxClient(server.url, KEY) as client, httpx.Client(base_url=server.url, timeout=10) as http:
            client.create_rollout(row)
            (first,) = client.claim("c", 1, timeout_s=1).claims
            client.finish("again", first.attempt_id, "FAILED", reason=FailureReason.CRASH)
            deadline = time.monotonic() + 30
            while http.get("/v1/rollouts/again", headers={"x-api-key": KEY}).status_code != 404:
                assert time.monotonic() < deadline, "retention did not delete the rollout"
                time.sleep(0.05)
            client.create_rollout(row)
            (second,) = client.claim("c", 1, timeout_s=1).claims
            assert (second.rollout.rollout_id, second.attempt_id) == ("again", first.attempt_id)
            url = f"/v1/rollouts/again/attempts/{second.attempt_id}/events"
            old = http.post(url, json=reward, headers={"authorization": f"Bearer {first.token}"})
            assert old.status_code == 401 and "earlier one" in old.json()["error"]["message"], old.text
            assert client.get_rollout("again").reward is None
            gateway = http.get(
                f"/v1/rollouts/again/attempts/{second.attempt_id}/v1/models",
                headers={"authorization": f"Bearer {first.token}"},
            )
            assert gateway.status_code == 401
            new = http.post(url, json=reward, headers={"authorization": f"Bearer {second.token}"})
            assert new.status_code == 200 and client.get_rollout("again").reward == 1.0
    finally:
        server.stop()
