"""Routes built from the endpoint table: a handler is attached to one declared endpoint of
`calcx.api.endpoints`, and that declaration alone gives the route its method, path, audience
and body model, so none of them is written a second time on the server.

The shape of FastAPI's `APIRouter(dependencies=[Depends(auth)])`, built from plain Starlette
routes: the endpoint's audience is checked before every handler, then its body is read and
validated (size limit, JSON, the declared model), and the handler gets the model. FastAPI's routes
with a dependency cost 150-300 us more per request on a 2-core machine (about a fifth of the
server CPU a rollout takes), so the server keeps plain routes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import Response

from calcx.api.endpoints import ENDPOINTS, Auth, Endpoint
from calcx.server.auth import audience_for
from calcx.server.errors import read_model

if TYPE_CHECKING:
    from calcx.server.state import ServerState

#: A route's work once its caller is let in: the request, the shared state and the validated body
#: (the endpoint's request model; None where it declares none).
Handler = Callable[[Request, "ServerState", Any], Awaitable[Response]]
H = TypeVar("H", bound=Handler)
ASGIEndpoint = Callable[[Request], Awaitable[Response]]


class Routes:
    """The handlers of one resource module, each attached to the endpoint it serves."""

    def __init__(self) -> None:
        self.handlers: dict[Endpoint, Handler] = {}

    def serve(self, endpoint: Endpoint) -> Callable[[H], H]:
        def attach(handler: H) -> H:
            if endpoint in self.handlers:
                raise ValueError(f"endpoint {endpoint.name} has two handlers here")
            self.handlers[endpoint] = handler
            return handler

        return attach


def handlers_by_endpoint(modules: Iterable[Routes]) -> dict[Endpoint, Handler]:
    """One handler for every declared endpoint, or ValueError naming what is missing or extra."""
    found: dict[Endpoint, Handler] = {}
    for routes in modules:
        for endpoint, handler in routes.handlers.items():
            if endpoint in found:
                raise ValueError(f"endpoint {endpoint.name} has two handlers")
            found[endpoint] = handler
    extra = [e.name for e in found if e not in ENDPOINTS]
    missing = [e.name for e in ENDPOINTS if e not in found]
    if extra or missing:
        raise ValueError(f"handlers must match calcx.api.endpoints: undeclared {extra}, unserved {missing}")
    return found


def include_routes(app: FastAPI, modules: Iterable[Routes], state: ServerState) -> None:
    """Add every declared endpoint to `app`, in the table's order, bound to `state`."""
    handlers = handlers_by_endpoint(modules)
    for endpoint in ENDPOINTS:
        app.router.add_route(
            endpoint.path,
            _asgi_endpoint(endpoint, handlers[endpoint], state),
            methods=[endpoint.method],
            name=endpoint.name,
            include_in_schema=False,
        )


def _asgi_endpoint(endpoint: Endpoint, handler: Handler, state: ServerState) -> ASGIEndpoint:
    audience = audience_for(endpoint.auth)
    auth = state.auth
    model = endpoint.request
    limit = state.settings.body_limit(endpoint.name)
    body_optional = endpoint.body_optional

    async def serve(request: Request) -> Response:
        if audience is not None:
            audience(auth, request)
        body = None if model is None else await read_model(request, model, limit, allow_empty=body_optional)
        return await handler(request, state, body)

    if endpoint.auth is not Auth.ATTEMPT:
        return serve
    budgets = state.budgets

    async def serve_attempt(request: Request) -> Response:
        """An attempt's URL: let in (its token), then one of the attempt's places in flight taken
        before its body is read (429 past them), given back however the request ends."""
        if audience is not None:
            audience(auth, request)
        params = request.path_params
        with budgets.in_flight(params["rid"], params["aid"]):
            body = None if model is None else await read_model(request, model, limit, allow_empty=body_optional)
            return await handler(request, state, body)

    return serve_attempt
