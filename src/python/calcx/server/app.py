"""The calcx server as a FastAPI app: `create_app(settings)` serves every endpoint of
calcx.api.endpoints with its handler from calcx.server.routes, on one shared state, with the
error answers and the store's life.

Bodies are read and validated by calcx.server.routing, not FastAPI (size limit first, then
JSON, then the endpoint's pydantic model), so every refusal has the `{"error": {"code",
"message"}}` shape and a cheap path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import replace

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from calcx.server import __version__
from calcx.server.auth import Authenticator
from calcx.server.budget import AttemptBudgets
from calcx.server.errors import APIError, error_response
from calcx.server.gateway import Gateway
from calcx.server.metrics import ServerMetrics
from calcx.server.replicas import Replicas
from calcx.server.routes import ROUTES
from calcx.server.routing import include_routes
from calcx.server.service import RolloutService
from calcx.server.settings import ServerSettings
from calcx.server.state import ServerState
from calcx.server.store import RolloutStore, StoreError

log = logging.getLogger("calcx.server")


def create_app(settings: ServerSettings) -> FastAPI:
    """Build the app; the SQLite store opens at startup, inside the serving event loop.
    `settings.public_url` must be set (the caller knows the address it listens on)."""
    if not settings.public_url:
        raise ValueError("create_app needs settings.public_url: the base URL agents reach this server at")
    settings = replace(settings, public_url=settings.public_url.rstrip("/"))
    metrics = ServerMetrics()
    service = RolloutService(settings, metrics)
    auth = Authenticator(settings.key, nonce_of=lambda rid, aid: service.db.attempts.token_nonce(rid, aid))
    state = ServerState(
        settings=settings, auth=auth, metrics=metrics, service=service, budgets=AttemptBudgets(settings)
    )
    replicas = Replicas()  # outlives a gateway: the homes of running rollouts, the endpoints' health
    service.signals.attempt_ended.append(replicas.release)
    metrics.watch_replicas(replicas.states)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = RolloutStore(settings.store_path)
        service.open(store)
        state.registry = store.registry.get() or {}
        gateway = Gateway(store, metrics, settings, replicas)
        await gateway.start()
        state.gateway = gateway
        reaper = asyncio.create_task(service.reap_leases(), name="calcx-lease-reaper")
        pruner = asyncio.create_task(service.prune(), name="calcx-retention")
        try:
            yield
        finally:
            service.begin_shutdown()
            reaper.cancel()
            pruner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            with contextlib.suppress(asyncio.CancelledError):
                await pruner
            await gateway.close()
            state.gateway = None
            service.close()
            store.close()

    app = FastAPI(
        title="calcx server", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.calcx = state
    metrics.watch_store(lambda: service.db.rollouts.count_by_state())
    _install_error_handlers(app, metrics)
    include_routes(app, ROUTES, state)
    return app


def _install_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    def _answer(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
        metrics.http_errors.labels(str(status), code).inc()
        return error_response(status, code, message, headers)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> Response:
        return _answer(exc.status, exc.code, exc.message, exc.headers)

    @app.exception_handler(StoreError)
    async def _store_error(request: Request, exc: StoreError) -> Response:
        return _answer(exc.status, exc.code, exc.message)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            return _answer(
                404, "not_found", f"no such endpoint: {request.method} {request.url.path} (see docs/server.md)"
            )
        if exc.status_code == 405:
            return _answer(405, "method_not_allowed", f"{request.method} is not allowed on {request.url.path}")
        return _answer(exc.status_code, "http_error", str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
        parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()[:10]]
        return _answer(422, "invalid_request", "; ".join(parts))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return _answer(500, "internal", f"internal server error ({type(exc).__name__}); see the server log")
