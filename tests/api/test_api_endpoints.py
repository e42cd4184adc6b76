"""The endpoint table: each endpoint declared once, paths filled with quoted ids. (That the server
serves exactly this table is tests/server/test_server_routes.py.)"""

from __future__ import annotations

from calcx.api import endpoints as api
from calcx.api.endpoints import ENDPOINTS


def test_each_endpoint_is_declared_once() -> None:
    assert len({e.name for e in ENDPOINTS}) == len(ENDPOINTS)
    assert len({(e.method, e.path) for e in ENDPOINTS}) == len(ENDPOINTS)
    declared = {value for value in vars(api).values() if isinstance(value, api.Endpoint)}
    assert declared == set(ENDPOINTS), "an endpoint declared outside ENDPOINTS is served by nobody"


def test_ids_are_quoted_into_the_path() -> None:
    assert api.FINISH.path_for(rid="a/b c", aid="1") == "/v1/rollouts/a%2Fb%20c/attempts/1/finish"


def test_only_a_body_with_a_model_may_be_left_out() -> None:
    assert all(e.request is not None for e in ENDPOINTS if e.body_optional)
