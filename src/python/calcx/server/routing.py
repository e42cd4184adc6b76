"""Routers: one per resource module, each serving one audience.

The shape of FastAPI's `APIRouter(dependencies=[Depends(auth)])`, built from plain Starlette
routes: the router's audience is checked before every handler, and a handler reads its own
request. FastAPI's routes with a dependency cost 150-300 us more per request on a 2-core
machine (about a fifth of the server CPU a rollout takes), so the server keeps plain routes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import Response

from calcx.server.auth import Audience

if TYPE_CHECKING:
    from calcx.server.state import ServerState

Handler = Callable[[Request, "ServerState"], Awaitable[Response]]
Endpoint = Callable[[Request], Awaitable[Response]]


class Router:
    def __init__(self, *, audience: Audience | None) -> None:
        """`audience` None: open to anyone (health checks, metrics scrapes)."""
        self.audience = audience
        self.routes: list[tuple[str, str, Handler]] = []

    def route(self, method: str, path: str) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            self.routes.append((method, path, handler))
            return handler

        return register

    def get(self, path: str) -> Callable[[Handler], Handler]:
        return self.route("GET", path)

    def post(self, path: str) -> Callable[[Handler], Handler]:
        return self.route("POST", path)

    def put(self, path: str) -> Callable[[Handler], Handler]:
        return self.route("PUT", path)


def include_router(app: FastAPI, router: Router, state: ServerState) -> None:
    """Add the router's routes to `app`, each bound to `state` behind the router's audience."""
    for method, path, handler in router.routes:
        app.router.add_route(
            path, _endpoint(handler, router.audience, state), methods=[method], name=handler.__name__,
            include_in_schema=False,
        )


def _endpoint(handler: Handler, audience: Audience | None, state: ServerState) -> Endpoint:
    if audience is None:

        async def open_endpoint(request: Request) -> Response:
            return await handler(request, state)

        return open_endpoint
    auth = state.auth

    async def endpoint(request: Request) -> Response:
        audience(auth, request)
        return await handler(request, state)

    return endpoint
