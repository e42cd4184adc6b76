"""The server's routes come from calcx.api's endpoint table alone: the app serves exactly the
declared endpoints, each with the audience and the body model its declaration names, and a handler
that does not match the table stops the app from being built."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest
from starlette.routing import Route

from calcx.api.client import CalcxClient
from calcx.api.endpoints import ENDPOINTS, HEALTH, Auth, Endpoint
from calcx.api.tokens import attempt_token
from calcx.server.routes import ROUTES
from calcx.server.routing import Routes, handlers_by_endpoint
from calcx.server.serve import ServerThread, start_server_thread

KEY = "routes-table-key-0123456789-abcdef"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    thread = start_server_thread(str(tmp_path_factory.mktemp("routes") / "calcx.db"), KEY)
    try:
        yield thread
    finally:
        thread.stop()


@pytest.fixture(scope="module")
def running(server: ServerThread) -> tuple[str, str, str]:
    """A RUNNING attempt and its token, which the attempt-token endpoints must take."""
    with CalcxClient(server.url, KEY) as client:
        client.create_rollout({"rollout_id": "routes", "row": {"question": "q", "result": "1"}})
        (claim,) = client.claim("routes-test", 1, timeout_s=1).claims
    return claim.rollout.rollout_id, claim.attempt_id, claim.token


def test_the_app_serves_every_declared_endpoint_and_nothing_else(server: ServerThread) -> None:
    served = [
        (method, route.path, route.name)
        for route in server.app.routes
        if isinstance(route, Route)
        for method in (route.methods or ())
        if method != "HEAD"
    ]
    assert sorted(served) == sorted((e.method, e.path, e.name) for e in ENDPOINTS)


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=[e.name for e in ENDPOINTS])
def test_each_endpoint_takes_the_credentials_it_declares(
    server: ServerThread, running: tuple[str, str, str], endpoint: Endpoint
) -> None:
    rid, aid, token = running
    path = endpoint.path_for(rid=rid, aid=aid)
    nonce = token.rsplit(".", 2)[1]
    # long polls must answer at once; no request here is valid enough to change anything
    query = {"timeout_s": 0} if endpoint.long_poll and endpoint.method == "GET" else None
    body = {"timeout_s": 0} if endpoint.long_poll and endpoint.method == "POST" else None
    with httpx.Client(base_url=server.url, timeout=10) as http:

        def status(bearer: str | None) -> int:
            headers = {"authorization": f"Bearer {bearer}"} if bearer else {}
            return http.request(endpoint.method, path, headers=headers, params=query, json=body).status_code

        if endpoint.auth is Auth.OPEN:
            assert status(None) == endpoint.status
            return
        assert status(None) == 401
        assert status(KEY) not in (401, 403)
        if endpoint.auth is Auth.SERVER_KEY:
            assert status(token) == 403
        else:
            assert status(token) not in (401, 403)
            # an attempt no claim made (its MAC valid, its nonce the attempt's nonce of none): unknown
            assert status(attempt_token(KEY, rid, "9", nonce)) == 401


WITH_BODY = [e for e in ENDPOINTS if e.request is not None]


@pytest.mark.parametrize("endpoint", WITH_BODY, ids=[e.name for e in WITH_BODY])
def test_each_body_is_read_as_the_declared_model(
    server: ServerThread, running: tuple[str, str, str], endpoint: Endpoint
) -> None:
    assert endpoint.request is not None
    rid, aid, _ = running
    path = endpoint.path_for(rid=rid, aid=aid)
    required = [name for name, field in endpoint.request.model_fields.items() if field.is_required()]
    with httpx.Client(base_url=server.url, timeout=10, headers={"authorization": f"Bearer {KEY}"}) as http:
        not_an_object = http.request(endpoint.method, path, json=[1])
        assert (not_an_object.status_code, not_an_object.json()["error"]["code"]) == (422, "invalid_body")
        if endpoint.body_optional:  # the model's defaults, then the handler: no such rollout
            empty = http.request(endpoint.method, endpoint.path_for(rid="no-such-rollout", aid=aid), content=b"")
            assert empty.status_code == 404, empty.text
        else:
            empty = http.request(endpoint.method, path, content=b"")
            assert (empty.status_code, empty.json()["error"]["code"]) == (422, "invalid_json")
        for name in required:  # each required field of the model, left out, is named in the refusal
            answer = http.request(endpoint.method, path, json={k: None for k in required if k != name})
            assert answer.status_code == 422, answer.text
            assert f"body.{name}" in answer.json()["error"]["message"]


def test_handlers_must_match_the_table() -> None:
    assert set(handlers_by_endpoint(ROUTES)) == set(ENDPOINTS)
    without_health = Routes()
    for routes in ROUTES:
        without_health.handlers.update({e: h for e, h in routes.handlers.items() if e is not HEALTH})
    with pytest.raises(ValueError, match=r"unserved \['health'\]"):
        handlers_by_endpoint([without_health])
    stray = Routes()
    stray.serve(replace(HEALTH, name="stray", path="/stray"))(ROUTES[0].handlers[HEALTH])
    with pytest.raises(ValueError, match=r"undeclared \['stray'\]"):
        handlers_by_endpoint([*ROUTES, stray])
    twice = Routes()
    twice.serve(HEALTH)(ROUTES[0].handlers[HEALTH])
    with pytest.raises(ValueError, match="health has two handlers"):
        handlers_by_endpoint([*ROUTES, twice])
