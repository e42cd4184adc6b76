"""The one client of the calcx server: `AsyncCalcxClient`, and `CalcxClient`, its blocking face.

Every method is written once, as an `@endpoint` that builds a `Call` from one row of
`calcx.api.endpoints` (path, answer model, long-poll or gateway timeout); each face runs it on its
transport: `AsyncCalcxClient` awaits it on an `httpx.AsyncClient`, `CalcxClient` sends the very same
call through an `httpx.Client`. The descriptor gives each face its own return type (a coroutine of
`T`, which `asyncio.create_task` takes too, or `T`), so type checkers see what a caller gets. Error
answers and unreachable servers raise `CalcxAPIError` (`calcx.api.errors`). Neither retries: the
controller, agent and trainer each keep their own retry policy, on top of `CalcxAPIError.status`.
"""

from __future__ import annotations

import functools
import json
import socket
import ssl
from collections.abc import Callable, Coroutine, Generator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

import httpx

from calcx.api import endpoints as api
from calcx.api.endpoints import POLL_MARGIN_S, Endpoint
from calcx.api.errors import BAD_RESPONSE, CalcxAPIError
from calcx.api.models import (
    AttemptRef,
    ClaimsResponse,
    Health,
    HeartbeatResponse,
    ModelRegistry,
    RecordedCall,
    Rollout,
    RolloutCreate,
    RunLease,
    TerminalPage,
)
from calcx.contract.failures import FailureReason

T = TypeVar("T")
P = ParamSpec("P")

# Requests go out as header and body writes; without TCP_NODELAY, Nagle's algorithm holds the
# body until the server's delayed ACK (~40 ms per request).
_SOCKET_OPTIONS = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]


@functools.cache
def _verifying_tls() -> ssl.SSLContext:
    """httpx's default: verify against the CA bundle (or SSL_CERT_FILE / SSL_CERT_DIR)."""
    return httpx.create_ssl_context()


@functools.cache
def _refusing_tls() -> ssl.SSLContext:
    """Loads no CA at all, so it trusts no certificate: a TLS handshake through it always fails."""
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


def tls_context(base_url: str) -> ssl.SSLContext:
    """The TLS context for a client of `base_url`, one per process.

    Building a verifying context loads the CA bundle, tens of milliseconds of CPU, and httpx
    builds one for every transport: every trainer session (one client each, all started at once)
    and every agent's reward post paid it, even over plain http. An https server gets the shared
    verifying context; an http one a context that loads nothing and, should TLS ever be
    attempted through it, refuses every certificate."""
    return _verifying_tls() if base_url.lower().startswith("https:") else _refusing_tls()


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request to one endpoint, and what the method returns from the answer (`pick`)."""

    endpoint: Endpoint
    path_params: Mapping[str, str] = field(default_factory=dict)
    body: Any = None
    query: Mapping[str, Any] | None = None
    #: long polls: how long the server may hold the answer
    poll_s: float | None = None
    #: an absolute URL the server handed out ($AGL_EVENT_URL) instead of the endpoint's path
    url: str | None = None
    pick: Callable[[Any], T] | None = None

    def target(self) -> str:
        return self.url or self.endpoint.path_for(**self.path_params)

    def timeout(self, default: float) -> float:
        if self.endpoint.long_poll:
            return (self.poll_s or 0.0) + POLL_MARGIN_S
        return default if self.endpoint.timeout_s is None else self.endpoint.timeout_s

    def read(self, response: httpx.Response, request: str) -> T:
        """The answer as the endpoint's model (then `pick`), or `CalcxAPIError`."""
        if not 200 <= response.status_code < 300:
            raise CalcxAPIError.from_response(response, request)
        model = self.endpoint.response
        try:
            if model is not None:
                answer: Any = model.model_validate_json(response.content)
            elif response.headers.get("content-type", "").startswith("application/json"):
                answer = response.json()
            else:
                answer = response.text
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            what = model.__name__ if model is not None else "JSON"
            raise CalcxAPIError(
                response.status_code, BAD_RESPONSE, f"the answer is not {what}: {exc}"[:500], request
            ) from exc
        return self.pick(answer) if self.pick is not None else answer


#: Several calls, each sent with the answer to the one before (`all_rollouts` pages through them).
Plan = Generator[Call[Any], Any, T]


class endpoint(Generic[P, T]):
    """A client method written once: `build` turns the arguments into a `Call` (or a `Plan`), and the
    face it is read from runs it: `AsyncCalcxClient` returns a coroutine, `CalcxClient` the value."""

    def __init__(self, build: Callable[Concatenate[Any, P], Call[T] | Plan[T]]) -> None:
        self._build = build
        self.__name__ = build.__name__
        self.__doc__ = build.__doc__

    @overload
    def __get__(self, client: None, owner: type) -> endpoint[P, T]: ...
    @overload
    def __get__(self, client: AsyncCalcxClient, owner: type) -> Callable[P, Coroutine[Any, Any, T]]: ...
    @overload
    def __get__(self, client: CalcxClient, owner: type) -> Callable[P, T]: ...
    @overload
    def __get__(self, client: _Endpoints, owner: type) -> Callable[P, Any]: ...

    def __get__(self, client: _Endpoints | None, owner: type) -> Any:
        if client is None:
            return self
        build = self._build

        @functools.wraps(build)
        def method(*args: Any, **kwargs: Any) -> Any:
            built = build(client, *args, **kwargs)
            return client._send(built) if isinstance(built, Call) else client._drive(built)

        return method


def _create_body(rollouts: Iterable[RolloutCreate | Mapping[str, Any]]) -> dict[str, Any]:
    return {"rollouts": [r.model_dump(mode="json") if isinstance(r, RolloutCreate) else dict(r) for r in rollouts]}


def _rollouts(page: Any) -> list[Rollout]:
    return page.rollouts


def _list_call(
    state: str | None, group_id: str | None, controller_id: str | None, limit: int, offset: int
) -> Call[list[Rollout]]:
    query: dict[str, Any] = {"limit": limit, "offset": offset}
    for name, value in (("state", state), ("group_id", group_id), ("controller_id", controller_id)):
        if value is not None:
            query[name] = value
    return Call(api.LIST_ROLLOUTS, query=query, pick=_rollouts)


def _every_rollout(page: int) -> Generator[Call[list[Rollout]], list[Rollout], list[Rollout]]:
    out: list[Rollout] = []
    while True:
        batch = yield _list_call(None, None, None, page, len(out))
        out.extend(batch)
        if len(batch) < page:
            return out


def _headers(key: str) -> dict[str, str]:
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    return headers


def _event_call(rollout_id: str, attempt_id: str, event_type: str, data: Mapping[str, Any]) -> Call[int]:
    body = {"event_type": event_type, "data": dict(data)}
    return Call(api.POST_EVENT, {"rid": rollout_id, "aid": attempt_id}, body=body, pick=_event_id)


def _event_id(created: Any) -> int:
    return created.event_id


class _Endpoints:
    """One method per endpoint, written once (`@endpoint`): `_send` runs a `Call`, `_drive` a `Plan`."""

    base_url: str
    _timeout: float

    def _send(self, call: Call[Any]) -> Any:
        raise NotImplementedError

    def _drive(self, plan: Plan[Any]) -> Any:
        raise NotImplementedError

    def _prepare(self, call: Call[Any]) -> tuple[str, dict[str, Any]]:
        """("METHOD url" for errors, keyword arguments of httpx's `request`)."""
        target = call.target()
        method = call.endpoint.method
        content = None if call.body is None else json.dumps(call.body).encode()
        request = {
            "method": method,
            "url": target,
            "content": content,
            "params": call.query,
            "timeout": call.timeout(self._timeout),
        }
        return f"{method} {target if call.url else self.base_url + target}", request

    # -- open ------------------------------------------------------------------------------
    @endpoint
    def health(self) -> Call[Health]:
        return Call(api.HEALTH)

    @endpoint
    def metrics_text(self) -> Call[str]:
        return Call(api.METRICS)

    # -- rollouts (server key) -------------------------------------------------------------
    @endpoint
    def create_rollouts(self, rollouts: Iterable[RolloutCreate | Mapping[str, Any]]) -> Call[list[Rollout]]:
        return Call(api.CREATE_ROLLOUTS, body=_create_body(rollouts), pick=_rollouts)

    @endpoint
    def create_rollout(self, rollout: RolloutCreate | Mapping[str, Any]) -> Call[Rollout]:
        return Call(api.CREATE_ROLLOUTS, body=_create_body([rollout]), pick=lambda p: p.rollouts[0])

    @endpoint
    def get_rollout(self, rollout_id: str) -> Call[Rollout]:
        return Call(api.GET_ROLLOUT, {"rid": rollout_id})

    @endpoint
    def list_rollouts(
        self,
        state: str | None = None,
        group_id: str | None = None,
        controller_id: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> Call[list[Rollout]]:
        return _list_call(state, group_id, controller_id, limit, offset)

    @endpoint
    def all_rollouts(self, page: int = 1000) -> Plan[list[Rollout]]:
        """Every rollout on the server, in creation order (`page` per request)."""
        return _every_rollout(page)

    @endpoint
    def wait(self, rollout_id: str, timeout_s: float = 30.0) -> Call[Rollout]:
        """Long poll: the rollout once terminal, or as it is after `timeout_s`."""
        return Call(api.WAIT, {"rid": rollout_id}, body={"timeout_s": timeout_s}, poll_s=timeout_s)

    @endpoint
    def retry(self, rollout_id: str, force: bool = False) -> Call[Rollout]:
        """A new attempt after a FAILED one; one the cancel API ended only with `force`."""
        return Call(api.RETRY, {"rid": rollout_id}, body={"force": force})

    @endpoint
    def cancel(
        self,
        run: str | None = None,
        rollout_ids: Iterable[str] | None = None,
        detail: str | None = None,
        owner: str | None = None,
    ) -> Call[list[AttemptRef]]:
        """FAIL (reason cancelled_by_api) the QUEUED and RUNNING attempts of run `run` or of
        `rollout_ids`; their controllers stop the running ones. Returns the attempts cancelled.
        `owner`: the sender's lease of the run (409 lease_lost when another trainer holds it)."""
        body: dict[str, Any] = {
            "run": run,
            "rollout_ids": None if rollout_ids is None else list(rollout_ids),
            "detail": detail,
            "owner": owner,
        }
        return Call(api.CANCEL, body=body, pick=lambda answer: answer.cancelled)

    @endpoint
    def record_trained(self, run: str, step: int, rollout_ids: Iterable[str], owner: str | None = None) -> Call[int]:
        """Tell the server's training ledger that `step` of `run` trained these rollouts; returns
        how many the step holds (409: one was trained before, or the step holds another batch;
        409 lease_lost: another trainer holds the run)."""
        body = {"run": run, "step": step, "rollout_ids": list(rollout_ids), "owner": owner}
        return Call(api.RECORD_TRAINED, body=body, pick=lambda answer: answer.recorded)

    @endpoint
    def rewind(self, run: str, after_step: int, owner: str | None = None) -> Call[list[int]]:
        """Roll back the ledger of `run`'s steps after `after_step` (a resume from its
        checkpoint); returns those steps."""
        return Call(
            api.REWIND,
            body={"run": run, "after_step": after_step, "owner": owner},
            pick=lambda answer: answer.rolled_back,
        )

    # -- run leases (server key) -------------------------------------------------------------
    @endpoint
    def acquire_lease(self, run: str, owner: str, take_over: bool = False) -> Call[RunLease]:
        """Take run `run` for trainer `owner` (409 run_leased while another trainer's lease is
        live, unless `take_over`)."""
        return Call(api.ACQUIRE_LEASE, body={"run": run, "owner": owner, "take_over": take_over})

    @endpoint
    def renew_lease(self, run: str, owner: str) -> Call[RunLease]:
        """Extend `owner`'s lease of `run` (409 lease_lost once another trainer took it)."""
        return Call(api.RENEW_LEASE, body={"run": run, "owner": owner})

    @endpoint
    def release_lease(self, run: str, owner: str) -> Call[RunLease]:
        """End `owner`'s lease of `run` now: the next start of the run needs no take-over."""
        return Call(api.RELEASE_LEASE, body={"run": run, "owner": owner})

    @endpoint
    def calls(self, rollout_id: str, attempt_id: str | None = None) -> Call[list[RecordedCall]]:
        query = None if attempt_id is None else {"attempt_id": attempt_id}
        return Call(api.CALLS, {"rid": rollout_id}, query=query, pick=lambda page: page.calls)

    @endpoint
    def terminal(self, after: int = 0, limit: int = 100, timeout_s: float = 30.0) -> Call[TerminalPage]:
        query = {"after": after, "limit": limit, "timeout_s": timeout_s}
        return Call(api.TERMINAL, query=query, poll_s=timeout_s)

    # -- controllers (server key) ----------------------------------------------------------
    @endpoint
    def claim(self, controller_id: str, max: int = 1, timeout_s: float = 10.0) -> Call[ClaimsResponse]:
        body = {"controller_id": controller_id, "max": max, "timeout_s": timeout_s}
        return Call(api.CLAIM, body=body, poll_s=timeout_s)

    @endpoint
    def heartbeat(
        self, controller_id: str, attempts: Iterable[tuple[str, str]] | None = None
    ) -> Call[HeartbeatResponse]:
        body: dict[str, Any] = {"controller_id": controller_id}
        if attempts is not None:
            body["attempts"] = [{"rollout_id": r, "attempt_id": a} for r, a in attempts]
        return Call(api.HEARTBEAT, body=body)

    @endpoint
    def finish(
        self,
        rollout_id: str,
        attempt_id: str,
        state: str,
        reason: FailureReason | None = None,
        exit_code: int | None = None,
        agent_seconds: float | None = None,
        detail: str | None = None,
    ) -> Call[Rollout]:
        body = {
            "state": state,
            "reason": reason,
            "exit_code": exit_code,
            "agent_seconds": agent_seconds,
            "detail": detail,
        }
        return Call(api.FINISH, {"rid": rollout_id, "aid": attempt_id}, body=body)

    # -- agents (attempt token or server key) ----------------------------------------------
    @endpoint
    def post_event(self, rollout_id: str, attempt_id: str, event_type: str, data: Mapping[str, Any]) -> Call[int]:
        return _event_call(rollout_id, attempt_id, event_type, data)

    @endpoint
    def post_event_to(self, event_url: str, event_type: str, data: Mapping[str, Any]) -> Call[int]:
        """`post_event` at the URL the server handed the agent ($AGL_EVENT_URL)."""
        body = {"event_type": event_type, "data": dict(data)}
        return Call(api.POST_EVENT, body=body, url=event_url, pick=_event_id)

    @endpoint
    def post_reward(self, rollout_id: str, attempt_id: str, value: float) -> Call[int]:
        return _event_call(rollout_id, attempt_id, "reward", {"value": value})

    @endpoint
    def chat_completions(self, rollout_id: str, attempt_id: str, request: Mapping[str, Any]) -> Call[dict[str, Any]]:
        return Call(api.CHAT_COMPLETIONS, {"rid": rollout_id, "aid": attempt_id}, body=dict(request))

    @endpoint
    def openai_models(self, rollout_id: str, attempt_id: str) -> Call[dict[str, Any]]:
        return Call(api.OPENAI_MODELS, {"rid": rollout_id, "aid": attempt_id})

    # -- model registry (server key) -------------------------------------------------------
    @endpoint
    def put_models(self, model: str, endpoints: list[str], policy_version: int = 0) -> Call[ModelRegistry]:
        body = {"model": model, "endpoints": endpoints, "policy_version": int(policy_version)}
        return Call(api.PUT_MODELS, body=body)

    @endpoint
    def get_models(self) -> Call[ModelRegistry]:
        return Call(api.GET_MODELS)


class AsyncCalcxClient(_Endpoints):
    """The client: `await client.<endpoint>(...)`; one connection pool, `await client.aclose()` when done."""

    def __init__(
        self,
        base_url: str,
        key: str,
        timeout: float = 30.0,
        max_connections: int = 256,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = timeout
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=_headers(key),
            timeout=timeout,
            transport=transport
            or httpx.AsyncHTTPTransport(
                verify=tls_context(self.base_url), socket_options=_SOCKET_OPTIONS, limits=limits
            ),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncCalcxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _send(self, call: Call[Any]) -> Any:
        request, kwargs = self._prepare(call)
        try:
            response = await self._http.request(**kwargs)
        except httpx.HTTPError as exc:
            raise CalcxAPIError.from_transport(exc, request) from exc
        return call.read(response, request)

    async def _drive(self, plan: Plan[Any]) -> Any:
        answer = None
        try:
            while True:
                answer = await self._send(plan.send(answer))
        except StopIteration as done:
            return done.value


class CalcxClient(_Endpoints):
    """The same methods, blocking, through an `httpx.Client`; close it (or use `with`)."""

    def __init__(
        self, base_url: str, key: str, timeout: float = 30.0, transport: httpx.BaseTransport | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = timeout
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=_headers(key),
            timeout=timeout,
            transport=transport
            or httpx.HTTPTransport(verify=tls_context(self.base_url), socket_options=_SOCKET_OPTIONS),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> CalcxClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, call: Call[Any]) -> Any:
        request, kwargs = self._prepare(call)
        try:
            response = self._http.request(**kwargs)
        except httpx.HTTPError as exc:
            raise CalcxAPIError.from_transport(exc, request) from exc
        return call.read(response, request)

    def _drive(self, plan: Plan[Any]) -> Any:
        answer = None
        try:
            while True:
                answer = self._send(plan.send(answer))
        except StopIteration as done:
            return done.value


__all__ = ["AsyncCalcxClient", "CalcxAPIError", "CalcxClient", "Call"]
