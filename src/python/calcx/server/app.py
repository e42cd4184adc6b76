"""The calcx server as a FastAPI app: rollouts, claims, events, model registry and gateway.

Handlers read and validate bodies themselves (size limit first, then JSON, then the pydantic
model) so every refusal has the `{"error": {"code", "message"}}` shape and a cheap path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from calcx.api.models import (
    TERMINAL_STATES,
    ClaimRequest,
    CreateRolloutsRequest,
    EventCreate,
    FinishRequest,
    HeartbeatRequest,
    ModelRegistryUpdate,
    WaitRequest,
    reward_value,
)
from calcx.api.tokens import attempt_token
from calcx.contract.env import (
    AGL_EVENT_URL,
    AGL_KEY,
    AGL_OPENAI_BASE_URL,
    CALCX_ATTEMPT_ID,
    CALCX_ROLLOUT_ID,
    DEFAULT_ENV_MAP,
    env_value,
)
from calcx.server import __version__
from calcx.server.auth import Authenticator
from calcx.server.errors import APIError, error_response, json_response, read_json, read_model
from calcx.server.gateway import Gateway
from calcx.server.metrics import ServerMetrics
from calcx.server.settings import ServerSettings
from calcx.server.signals import Signals
from calcx.server.store import RolloutStore, StoreError

log = logging.getLogger("calcx.server")

Handler = Callable[[Request], Awaitable[Response]]

_STATES = ("QUEUED", "RUNNING", "SUCCEEDED", "FAILED")
_KNOWN_EVENT_TYPES = frozenset({"reward", "log", "tool_call", "answer", "error", "message"})


@dataclass
class ServerState:
    """Everything the handlers share; the store exists between startup and shutdown."""

    settings: ServerSettings
    auth: Authenticator
    metrics: ServerMetrics
    signals: Signals = field(default_factory=Signals)
    store: RolloutStore | None = None
    gateway: Gateway | None = None
    registry: dict[str, Any] = field(default_factory=dict)
    closing: bool = False

    def begin_shutdown(self) -> None:
        """Answer every long poll now (called when the HTTP server starts shutting down)."""
        self.closing = True
        self.signals.fire_all()

    @property
    def db(self) -> RolloutStore:
        if self.store is None:
            raise APIError(503, "starting", "the server is starting or stopping; try again shortly")
        return self.store


def _check_env_map(rollouts: CreateRolloutsRequest) -> None:
    for spec in rollouts.rollouts:
        env_map = spec.env_map if spec.env_map is not None else DEFAULT_ENV_MAP
        for var, column in env_map.items():
            if column not in spec.row:
                raise APIError(
                    422,
                    "invalid_body",
                    f"rollout {spec.rollout_id!r}: env_map maps {var} to row field {column!r}, which the row does "
                    f"not have (row fields: {sorted(spec.row)[:20]}); add the field or pass an env_map",
                )


def _parse_int(name: str, raw: str | None, default: int, lo: int, hi: int) -> int:
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise APIError(422, "invalid_query", f"query parameter {name}={raw!r} must be an integer") from None
    if not lo <= value <= hi:
        raise APIError(422, "invalid_query", f"query parameter {name}={value} must be between {lo} and {hi}")
    return value


def _parse_float(name: str, raw: str | None, default: float) -> float:
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise APIError(422, "invalid_query", f"query parameter {name}={raw!r} must be a number") from None
    if not value >= 0 or value == float("inf"):
        raise APIError(422, "invalid_query", f"query parameter {name}={raw!r} must be a finite number >= 0")
    return value


def create_app(settings: ServerSettings) -> FastAPI:
    """Build the app; the SQLite store opens at startup, inside the serving event loop.
    `settings.public_url` must be set (the caller knows the address it listens on)."""
    if not settings.public_url:
        raise ValueError("create_app needs settings.public_url: the base URL agents reach this server at")
    settings = replace(settings, public_url=settings.public_url.rstrip("/"))
    state = ServerState(settings=settings, auth=Authenticator(settings.key), metrics=ServerMetrics())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = RolloutStore(settings.store_path)
        renewed = store.attempts.renew_running_leases(settings.lease_s)
        if renewed:
            log.warning(
                "%d attempt(s) were RUNNING when the server stopped; their controllers have %.0f s to "
                "heartbeat before they fail with reason controller_lost",
                renewed,
                settings.lease_s,
            )
        state.registry = store.registry.get() or {}
        state.store = store
        state.closing = False
        gateway = Gateway(store, state.metrics, settings)
        await gateway.start()
        state.gateway = gateway
        reaper = asyncio.create_task(_reap_leases(state), name="calcx-lease-reaper")
        try:
            yield
        finally:
            state.begin_shutdown()
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            await gateway.close()
            state.gateway = None
            state.store = None
            store.close()

    app = FastAPI(
        title="calcx server", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.calcx = state
    state.metrics.watch_store(lambda: state.db.rollouts.count_by_state())
    _install_error_handlers(app, state)
    _install_routes(app, state)
    return app


async def _reap_leases(state: ServerState) -> None:
    """Fail RUNNING attempts whose controller stopped heartbeating (reason controller_lost)."""
    interval = state.settings.lease_check_s
    while True:
        await asyncio.sleep(interval)
        store = state.store
        if store is None:
            continue
        try:
            expired = store.attempts.expire_leases()
        except Exception:  # keep reaping; a transient SQLite error must not end the task
            log.exception("lease reaper failed")
            continue
        for item in expired:
            log.warning(
                "attempt %s of rollout %s failed: controller %s lost (lease expired)",
                item.attempt_id,
                item.rollout_id,
                item.controller_id,
            )
            state.metrics.finished.labels("FAILED", "controller_lost").inc()
            state.signals.rollout_terminal.fire(item.rollout_id)
        if expired:
            state.signals.terminal.fire()


def _install_error_handlers(app: FastAPI, state: ServerState) -> None:
    metrics = state.metrics

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


def _install_routes(app: FastAPI, state: ServerState) -> None:
    settings = state.settings
    auth = state.auth
    metrics = state.metrics
    signals = state.signals
    limit = settings.max_body_bytes

    def route(method: str, path: str) -> Callable[[Handler], Handler]:
        """Plain Starlette routes: handlers take the request and parse it themselves, which
        skips FastAPI's per-request dependency solving."""

        def register(handler: Handler) -> Handler:
            app.router.add_route(path, handler, methods=[method], include_in_schema=False)
            return handler

        return register

    def build_claim(rollout: dict[str, Any], attempt_id: str) -> dict[str, Any]:
        rid = rollout["rollout_id"]
        token = attempt_token(settings.key, rid, attempt_id)
        row = rollout["row"]
        env_map = rollout.get("env_map") or DEFAULT_ENV_MAP
        env = {var: env_value(row.get(column)) for var, column in env_map.items()}
        prefix = f"{settings.public_url}/v1/rollouts/{rid}/attempts/{attempt_id}"
        env.update(
            {
                AGL_OPENAI_BASE_URL: f"{prefix}/v1",
                AGL_EVENT_URL: f"{prefix}/events",
                AGL_KEY: token,
                CALCX_ROLLOUT_ID: rid,
                CALCX_ATTEMPT_ID: attempt_id,
            }
        )
        return {
            "rollout": rollout,
            "attempt_id": attempt_id,
            "token": token,
            "env": env,
            "deadline_s": rollout["deadline_s"],
        }

    def rollout_or_404(rid: str) -> dict[str, Any]:
        rollout = state.db.rollouts.get(rid)
        if rollout is None:
            raise APIError(404, "not_found", f"no rollout {rid!r}")
        return rollout

    # ---- open endpoints -------------------------------------------------------------------

    @route("GET", "/healthz")
    async def healthz(request: Request) -> Response:
        status = "ok" if state.store is not None and not state.closing else "unavailable"
        return json_response({"status": status, "version": __version__}, 200 if status == "ok" else 503)

    @route("GET", "/metrics")
    async def prometheus_metrics(request: Request) -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    # ---- rollouts -------------------------------------------------------------------------

    @route("POST", "/v1/rollouts")
    async def create_rollouts(request: Request) -> Response:
        auth.require_server_key(request)
        body = await read_model(request, CreateRolloutsRequest, limit)
        _check_env_map(body)
        rollouts, created = state.db.rollouts.create(body.rollouts)
        if created:
            metrics.rollouts_created.inc(created)
            signals.queued.fire()
        return json_response({"rollouts": rollouts})

    @route("GET", "/v1/rollouts")
    async def list_rollouts(request: Request) -> Response:
        auth.require_server_key(request)
        q = request.query_params
        state_filter = q.get("state") or None
        if state_filter is not None and state_filter not in _STATES:
            raise APIError(422, "invalid_query", f"state={state_filter!r} must be one of {', '.join(_STATES)}")
        rollouts = state.db.rollouts.query(
            state=state_filter,
            group_id=q.get("group_id") or None,
            controller_id=q.get("controller_id") or None,
            limit=_parse_int("limit", q.get("limit"), settings.page_limit, 1, settings.max_page_limit),
            offset=_parse_int("offset", q.get("offset"), 0, 0, 2**62),
        )
        return json_response({"rollouts": rollouts})

    @route("GET", "/v1/rollouts/{rid}")
    async def get_rollout(request: Request) -> Response:
        rid = request.path_params["rid"]
        auth.require_server_key(request)
        return json_response(rollout_or_404(rid))

    @route("POST", "/v1/rollouts/{rid}/wait")
    async def wait_rollout(request: Request) -> Response:
        rid = request.path_params["rid"]
        auth.require_server_key(request)
        body = await read_model(request, WaitRequest, limit, allow_empty=True)
        deadline = time.monotonic() + settings.poll_timeout(body.timeout_s)
        while True:
            rollout = rollout_or_404(rid)
            remaining = deadline - time.monotonic()
            if rollout["state"] in TERMINAL_STATES or state.closing or remaining <= 0:
                return json_response(rollout)
            await signals.rollout_terminal.wait(rid, remaining)

    @route("POST", "/v1/rollouts/{rid}/retry")
    async def retry_rollout(request: Request) -> Response:
        rid = request.path_params["rid"]
        auth.require_server_key(request)
        state.db.attempts.retry(rid)
        metrics.retries.inc()
        signals.queued.fire()
        return json_response(rollout_or_404(rid))

    @route("GET", "/v1/rollouts/{rid}/calls")
    async def list_calls(request: Request) -> Response:
        rid = request.path_params["rid"]
        auth.require_server_key(request)
        attempt_id = request.query_params.get("attempt_id") or None
        return json_response({"calls": state.db.calls.query(rid, attempt_id)})

    @route("GET", "/v1/terminal")
    async def terminal(request: Request) -> Response:
        auth.require_server_key(request)
        q = request.query_params
        after = _parse_int("after", q.get("after"), 0, 0, 2**62)
        page = _parse_int("limit", q.get("limit"), settings.page_limit, 1, settings.max_page_limit)
        timeout = settings.poll_timeout(_parse_float("timeout_s", q.get("timeout_s"), settings.terminal_poll_s))
        deadline = time.monotonic() + timeout
        while True:
            found = state.db.attempts.terminal_after(after, page)
            remaining = deadline - time.monotonic()
            if found or state.closing or remaining <= 0:
                break
            await signals.terminal.wait(remaining)
        rollouts = {r["rollout_id"]: r for r in state.db.rollouts.get_many([rid for _, rid, _ in found])}
        items = [
            {"cursor": cursor, "attempt_id": aid, "rollout": rollouts[rid]}
            for cursor, rid, aid in found
            if rid in rollouts
        ]
        return json_response({"items": items, "next": found[-1][0] if found else after})

    # ---- controllers ----------------------------------------------------------------------

    @route("POST", "/v1/claims")
    async def claim(request: Request) -> Response:
        auth.require_server_key(request)
        body = await read_model(request, ClaimRequest, limit)
        deadline = time.monotonic() + settings.poll_timeout(body.timeout_s)
        waited = False
        while True:
            picked = state.db.attempts.claim(body.controller_id, body.max, settings.lease_s)
            remaining = deadline - time.monotonic()
            if picked or state.closing or remaining <= 0:
                break
            await signals.queued.wait(remaining)
            waited = True
        if picked and waited and await request.is_disconnected():
            # The controller gave up on this long poll (its own timeout): nobody would run these.
            state.db.attempts.unclaim(body.controller_id, picked)
            signals.queued.fire()
            log.info("claimer %s disconnected during its long poll; %d claim(s) requeued", body.controller_id, len(picked))
            return json_response({"claims": [], "lease_s": settings.lease_s})
        claims = []
        if picked:
            metrics.claims.inc(len(picked))
            rollouts = {r["rollout_id"]: r for r in state.db.rollouts.get_many([rid for rid, _ in picked])}
            claims = [build_claim(rollouts[rid], aid) for rid, aid in picked]
        return json_response({"claims": claims, "lease_s": settings.lease_s})

    @route("POST", "/v1/claims/heartbeat")
    async def heartbeat(request: Request) -> Response:
        auth.require_server_key(request)
        body = await read_model(request, HeartbeatRequest, limit)
        refs = None if body.attempts is None else [(a.rollout_id, a.attempt_id) for a in body.attempts]
        held, lost = state.db.attempts.heartbeat(body.controller_id, refs, settings.lease_s)
        return json_response(
            {
                "lease_s": settings.lease_s,
                "held": [{"rollout_id": r, "attempt_id": a} for r, a in held],
                "lost": [{"rollout_id": r, "attempt_id": a} for r, a in lost],
            }
        )

    @route("POST", "/v1/rollouts/{rid}/attempts/{aid}/finish")
    async def finish(request: Request) -> Response:
        rid, aid = request.path_params["rid"], request.path_params["aid"]
        auth.require_server_key(request)
        body = await read_model(request, FinishRequest, limit)
        if body.state == "SUCCEEDED" and body.reason is not None:
            raise APIError(422, "invalid_body", "a SUCCEEDED attempt has no failure reason; send reason: null")
        if body.state == "FAILED" and body.reason is None:
            raise APIError(422, "invalid_body", "a FAILED attempt needs a reason (e.g. crash, timeout)")
        state.db.attempts.finish(rid, aid, body.state, body.reason, body.exit_code, body.agent_seconds, body.detail)
        metrics.finished.labels(body.state, body.reason or "").inc()
        signals.rollout_terminal.fire(rid)
        signals.terminal.fire()
        return json_response(rollout_or_404(rid))

    # ---- agents (attempt token or server key) ---------------------------------------------

    @route("POST", "/v1/rollouts/{rid}/attempts/{aid}/events")
    async def post_event(request: Request) -> Response:
        rid, aid = request.path_params["rid"], request.path_params["aid"]
        auth.require_attempt(request, rid, aid)
        body = await read_model(request, EventCreate, limit)
        reward = None
        if body.event_type == "reward":
            try:
                reward = reward_value(body.data)
            except ValueError as exc:
                raise APIError(422, "invalid_reward", str(exc)) from None
        event_id = state.db.events.add(rid, aid, body.event_type, body.data, reward)
        metrics.events.labels(body.event_type if body.event_type in _KNOWN_EVENT_TYPES else "other").inc()
        return json_response({"event_id": event_id})

    @route("POST", "/v1/rollouts/{rid}/attempts/{aid}/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        rid, aid = request.path_params["rid"], request.path_params["aid"]
        auth.require_attempt(request, rid, aid)
        payload = await read_json(request, limit)
        current = state.db.attempts.state(rid, aid)
        if current != "RUNNING":
            raise APIError(
                409,
                "attempt_not_running",
                f"attempt {aid} of rollout {rid!r} is {current}; the gateway serves only RUNNING attempts",
            )
        registry = state.registry
        if not registry.get("endpoints"):
            raise APIError(
                503,
                "no_model",
                "no model is registered; the trainer (or rehearsal) must PUT /v1/models with the inference "
                "endpoints first",
            )
        gateway = state.gateway
        if gateway is None:
            raise APIError(503, "starting", "the server is starting or stopping; try again shortly")
        upstream_request = gateway.prepare(payload, registry)
        # Calls are stamped with the policy version their rollout was created for (the trainer
        # step, as verl stamps its own samples); the registry's version is the fallback.
        version = state.db.rollouts.policy_version(rid)
        if version is not None:
            registry = {**registry, "policy_version": version}
        status, content = await gateway.forward(rid, aid, upstream_request, registry)
        return Response(content=content, status_code=status, media_type="application/json")

    @route("GET", "/v1/rollouts/{rid}/attempts/{aid}/v1/models")
    async def openai_models(request: Request) -> Response:
        rid, aid = request.path_params["rid"], request.path_params["aid"]
        auth.require_attempt(request, rid, aid)
        model = state.registry.get("model")
        data = [] if not model else [{"id": model, "object": "model", "owned_by": "calcx"}]
        return json_response({"object": "list", "data": data})

    # ---- model registry -------------------------------------------------------------------

    @route("PUT", "/v1/models")
    async def put_models(request: Request) -> Response:
        auth.require_server_key(request)
        body = await read_model(request, ModelRegistryUpdate, limit)
        registry = {
            "model": body.model,
            "endpoints": body.endpoints,
            "policy_version": body.policy_version,
            "updated_at": time.time(),
        }
        state.db.registry.put(registry)
        state.registry = registry
        return json_response(registry)

    @route("GET", "/v1/models")
    async def get_models(request: Request) -> Response:
        auth.require_server_key(request)
        registry = state.registry or {"model": None, "endpoints": [], "policy_version": None, "updated_at": None}
        return json_response(registry)
