"""Every route the app serves belongs to one router of calcx.server.routes, and every router
names its audience: only /healthz and /metrics are open, and the attempt-token routes are the
ones under an attempt's own URL."""

from __future__ import annotations

from starlette.routing import Route

from calcx.server.app import create_app
from calcx.server.auth import own_attempt, server_key
from calcx.server.routes import ROUTERS
from calcx.server.settings import ServerSettings


def _declared() -> dict[tuple[str, str], object]:
    out: dict[tuple[str, str], object] = {}
    for router in ROUTERS:
        for method, path, _ in router.routes:
            assert (method, path) not in out, f"{method} {path} is declared twice"
            out[(method, path)] = router.audience
    return out


def test_the_app_serves_exactly_the_declared_routes() -> None:
    app = create_app(ServerSettings(key="k" * 32, public_url="http://127.0.0.1:1"))
    served = {(m, r.path) for r in app.routes if isinstance(r, Route) for m in (r.methods or ()) if m != "HEAD"}
    assert served == set(_declared())


def test_every_router_names_its_audience() -> None:
    declared = _declared()
    assert {p for (_, p), a in declared.items() if a is None} == {"/healthz", "/metrics"}
    for (method, path), audience in declared.items():
        if audience is own_attempt:
            assert path.startswith("/v1/rollouts/{rid}/attempts/{aid}/"), path
        elif audience is not None:
            assert audience is server_key, f"{method} {path}"
