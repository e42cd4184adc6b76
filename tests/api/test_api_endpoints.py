"""The endpoint table and the server agree: the same routes, and the auth the table names."""

from __future__ import annotations

from typing import Any, Iterator

import httpx
import pytest

from calcx.api.client import CalcxClient
from calcx.api.endpoints import ENDPOINTS, Auth
from calcx.api.tokens import attempt_token
from calcx.server.serve import ServerThread, start_server_thread

KEY = "api-table-key-0123456789-abcdefgh"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    thread = start_server_thread(str(tmp_path_factory.mktemp("api") / "calcx.db"), KEY)
    try:
        yield thread
    finally:
        thread.stop()


@pytest.fixture(scope="module")
def running(server: ServerThread) -> tuple[str, str]:
    with CalcxClient(server.url, KEY) as client:
        client.create_rollout({"rollout_id": "table", "row": {"question": "q", "result": "1"}})
        (claim,) = client.claim("table-test", 1, timeout_s=1).claims
    return claim.rollout.rollout_id, claim.attempt_id


def test_the_table_is_the_servers_routes(server: ServerThread) -> None:
    routes = {(method, route.path) for route in server.app.routes if getattr(route, "methods", None)
              for method in route.methods if method != "HEAD"}
    assert routes == {(e.method, e.path) for e in ENDPOINTS}


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=[e.name for e in ENDPOINTS])
def test_each_endpoint_takes_the_credentials_the_table_names(
    server: ServerThread, running: tuple[str, str], endpoint: Any
) -> None:
    rid, aid = running
    path = endpoint.path_for(rid=rid, aid=aid)
    token = attempt_token(KEY, rid, aid)
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
            assert status(attempt_token(KEY, rid, "9")) == 403
