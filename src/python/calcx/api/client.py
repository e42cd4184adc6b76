"""Typed clients of the calcx server: `CalcxClient` (sync) and `AsyncCalcxClient` (asyncio).

Every method maps to one endpoint of docs/architecture.md. Error answers raise
`CalcxAPIError(status, code, message)`; a server that cannot be reached raises
`CalcxConnectionError` (a `CalcxAPIError` with status 0). Long polls get a read timeout a little
longer than the poll itself.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

import httpx

from calcx.api.models import (
    ClaimsResponse,
    HeartbeatResponse,
    ModelRegistry,
    RecordedCall,
    Rollout,
    RolloutCreate,
    TerminalPage,
)

_POLL_MARGIN_S = 15.0
# Requests go out as header and body writes; without TCP_NODELAY, Nagle's algorithm holds the
# body until the server's delayed ACK (~40 ms per request).
_SOCKET_OPTIONS = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
_CHAT_TIMEOUT_S = 600.0


class CalcxAPIError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class CalcxConnectionError(CalcxAPIError):
    def __init__(self, message: str) -> None:
        super().__init__(0, "unreachable", message)


def _error_from(resp: httpx.Response) -> CalcxAPIError:
    code, message = "http_error", resp.text[:500] or resp.reason_phrase
    try:
        body = resp.json()
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict):
            code = str(err.get("code", code))
            message = str(err.get("message", message))
    except ValueError:
        pass
    return CalcxAPIError(resp.status_code, code, message)


def _create_body(rollouts: Iterable[RolloutCreate | Mapping[str, Any]]) -> dict[str, Any]:
    items = []
    for r in rollouts:
        items.append(r.model_dump(mode="json") if isinstance(r, RolloutCreate) else dict(r))
    return {"rollouts": items}


def _q(part: str) -> str:
    return quote(str(part), safe="")


def _headers(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}", "content-type": "application/json"}


class _Requests:
    """Paths and bodies shared by both clients; each returns (method, path, params, body, timeout)."""

    @staticmethod
    def finish_body(
        state: str, reason: str | None, exit_code: int | None, agent_seconds: float | None, detail: str | None
    ) -> dict[str, Any]:
        return {
            "state": state,
            "reason": reason,
            "exit_code": exit_code,
            "agent_seconds": agent_seconds,
            "detail": detail,
        }

    @staticmethod
    def list_params(
        state: str | None, group_id: str | None, controller_id: str | None, limit: int, offset: int
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if state is not None:
            params["state"] = state
        if group_id is not None:
            params["group_id"] = group_id
        if controller_id is not None:
            params["controller_id"] = controller_id
        return params


class CalcxClient:
    """Synchronous client; one keep-alive connection pool per instance. Close it (or use `with`)."""

    def __init__(self, base_url: str, key: str, timeout: float = 30.0, transport: httpx.BaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = timeout
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=_headers(key),
            timeout=timeout,
            transport=transport or httpx.HTTPTransport(socket_options=_SOCKET_OPTIONS),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> CalcxClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Any:
        content = None if body is None else json.dumps(body).encode()
        try:
            resp = self._http.request(
                method, path, content=content, params=params, timeout=timeout if timeout is not None else self._timeout
            )
        except httpx.TransportError as exc:
            raise CalcxConnectionError(f"cannot reach calcx server at {self.base_url}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 400:
            raise _error_from(resp)
        if resp.headers.get("content-type", "").startswith("application/json"):
            return resp.json()
        return resp.text

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/healthz")

    def metrics_text(self) -> str:
        return self._call("GET", "/metrics")

    def create_rollouts(self, rollouts: Iterable[RolloutCreate | Mapping[str, Any]]) -> list[Rollout]:
        data = self._call("POST", "/v1/rollouts", _create_body(rollouts))
        return [Rollout.model_validate(r) for r in data["rollouts"]]

    def create_rollout(self, rollout: RolloutCreate | Mapping[str, Any]) -> Rollout:
        return self.create_rollouts([rollout])[0]

    def get_rollout(self, rollout_id: str) -> Rollout:
        return Rollout.model_validate(self._call("GET", f"/v1/rollouts/{_q(rollout_id)}"))

    def list_rollouts(
        self,
        state: str | None = None,
        group_id: str | None = None,
        controller_id: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Rollout]:
        params = _Requests.list_params(state, group_id, controller_id, limit, offset)
        data = self._call("GET", "/v1/rollouts", params=params)
        return [Rollout.model_validate(r) for r in data["rollouts"]]

    def wait(self, rollout_id: str, timeout_s: float = 30.0) -> Rollout:
        data = self._call(
            "POST", f"/v1/rollouts/{_q(rollout_id)}/wait", {"timeout_s": timeout_s}, timeout=timeout_s + _POLL_MARGIN_S
        )
        return Rollout.model_validate(data)

    def terminal(self, after: int = 0, limit: int = 100, timeout_s: float = 30.0) -> TerminalPage:
        data = self._call(
            "GET",
            "/v1/terminal",
            params={"after": after, "limit": limit, "timeout_s": timeout_s},
            timeout=timeout_s + _POLL_MARGIN_S,
        )
        return TerminalPage.model_validate(data)

    def claim(self, controller_id: str, max: int = 1, timeout_s: float = 10.0) -> ClaimsResponse:
        data = self._call(
            "POST",
            "/v1/claims",
            {"controller_id": controller_id, "max": max, "timeout_s": timeout_s},
            timeout=timeout_s + _POLL_MARGIN_S,
        )
        return ClaimsResponse.model_validate(data)

    def heartbeat(self, controller_id: str, attempts: Iterable[tuple[str, str]] | None = None) -> HeartbeatResponse:
        body: dict[str, Any] = {"controller_id": controller_id}
        if attempts is not None:
            body["attempts"] = [{"rollout_id": r, "attempt_id": a} for r, a in attempts]
        return HeartbeatResponse.model_validate(self._call("POST", "/v1/claims/heartbeat", body))

    def finish(
        self,
        rollout_id: str,
        attempt_id: str,
        state: str,
        reason: str | None = None,
        exit_code: int | None = None,
        agent_seconds: float | None = None,
        detail: str | None = None,
    ) -> Rollout:
        body = _Requests.finish_body(state, reason, exit_code, agent_seconds, detail)
        return Rollout.model_validate(self._call("POST", f"/v1/rollouts/{_q(rollout_id)}/attempts/{_q(attempt_id)}/finish", body))

    def retry(self, rollout_id: str) -> Rollout:
        return Rollout.model_validate(self._call("POST", f"/v1/rollouts/{_q(rollout_id)}/retry"))

    def post_event(self, rollout_id: str, attempt_id: str, event_type: str, data: Mapping[str, Any]) -> int:
        body = {"event_type": event_type, "data": dict(data)}
        return int(self._call("POST", f"/v1/rollouts/{_q(rollout_id)}/attempts/{_q(attempt_id)}/events", body)["event_id"])

    def post_reward(self, rollout_id: str, attempt_id: str, value: float) -> int:
        return self.post_event(rollout_id, attempt_id, "reward", {"value": value})

    def calls(self, rollout_id: str, attempt_id: str | None = None) -> list[RecordedCall]:
        params = None if attempt_id is None else {"attempt_id": attempt_id}
        data = self._call("GET", f"/v1/rollouts/{_q(rollout_id)}/calls", params=params)
        return [RecordedCall.model_validate(c) for c in data["calls"]]

    def chat_completions(self, rollout_id: str, attempt_id: str, request: Mapping[str, Any]) -> dict[str, Any]:
        return self._call(
            "POST", f"/v1/rollouts/{_q(rollout_id)}/attempts/{_q(attempt_id)}/v1/chat/completions", dict(request), timeout=_CHAT_TIMEOUT_S
        )

    def put_models(self, model: str, endpoints: list[str], policy_version: int = 0) -> ModelRegistry:
        body = {"model": model, "endpoints": endpoints, "policy_version": policy_version}
        return ModelRegistry.model_validate(self._call("PUT", "/v1/models", body))

    def get_models(self) -> ModelRegistry:
        return ModelRegistry.model_validate(self._call("GET", "/v1/models"))


class AsyncCalcxClient:
    """Asyncio client with the same methods as `CalcxClient`; `await client.aclose()` when done."""

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
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=_headers(key),
            timeout=timeout,
            transport=transport
            or httpx.AsyncHTTPTransport(
                socket_options=_SOCKET_OPTIONS,
                limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            ),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncCalcxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Any:
        content = None if body is None else json.dumps(body).encode()
        try:
            resp = await self._http.request(
                method, path, content=content, params=params, timeout=timeout if timeout is not None else self._timeout
            )
        except httpx.TransportError as exc:
            raise CalcxConnectionError(f"cannot reach calcx server at {self.base_url}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 400:
            raise _error_from(resp)
        if resp.headers.get("content-type", "").startswith("application/json"):
            return resp.json()
        return resp.text

    async def health(self) -> dict[str, Any]:
        return await self._call("GET", "/healthz")

    async def metrics_text(self) -> str:
        return await self._call("GET", "/metrics")

    async def create_rollouts(self, rollouts: Iterable[RolloutCreate | Mapping[str, Any]]) -> list[Rollout]:
        data = await self._call("POST", "/v1/rollouts", _create_body(rollouts))
        return [Rollout.model_validate(r) for r in data["rollouts"]]

    async def create_rollout(self, rollout: RolloutCreate | Mapping[str, Any]) -> Rollout:
        return (await self.create_rollouts([rollout]))[0]

    async def get_rollout(self, rollout_id: str) -> Rollout:
        return Rollout.model_validate(await self._call("GET", f"/v1/rollouts/{_q(rollout_id)}"))

    async def list_rollouts(
        self,
        state: str | None = None,
        group_id: str | None = None,
        controller_id: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Rollout]:
        params = _Requests.list_params(state, group_id, controller_id, limit, offset)
        data = await self._call("GET", "/v1/rollouts", params=params)
        return [Rollout.model_validate(r) for r in data["rollouts"]]

    async def wait(self, rollout_id: str, timeout_s: float = 30.0) -> Rollout:
        data = await self._call(
            "POST", f"/v1/rollouts/{_q(rollout_id)}/wait", {"timeout_s": timeout_s}, timeout=timeout_s + _POLL_MARGIN_S
        )
        return Rollout.model_validate(data)

    async def terminal(self, after: int = 0, limit: int = 100, timeout_s: float = 30.0) -> TerminalPage:
        data = await self._call(
            "GET",
            "/v1/terminal",
            params={"after": after, "limit": limit, "timeout_s": timeout_s},
            timeout=timeout_s + _POLL_MARGIN_S,
        )
        return TerminalPage.model_validate(data)

    async def claim(self, controller_id: str, max: int = 1, timeout_s: float = 10.0) -> ClaimsResponse:
        data = await self._call(
            "POST",
            "/v1/claims",
            {"controller_id": controller_id, "max": max, "timeout_s": timeout_s},
            timeout=timeout_s + _POLL_MARGIN_S,
        )
        return ClaimsResponse.model_validate(data)

    async def heartbeat(
        self, controller_id: str, attempts: Iterable[tuple[str, str]] | None = None
    ) -> HeartbeatResponse:
        body: dict[str, Any] = {"controller_id": controller_id}
        if attempts is not None:
            body["attempts"] = [{"rollout_id": r, "attempt_id": a} for r, a in attempts]
        return HeartbeatResponse.model_validate(await self._call("POST", "/v1/claims/heartbeat", body))

    async def finish(
        self,
        rollout_id: str,
        attempt_id: str,
        state: str,
        reason: str | None = None,
        exit_code: int | None = None,
        agent_seconds: float | None = None,
        detail: str | None = None,
    ) -> Rollout:
        body = _Requests.finish_body(state, reason, exit_code, agent_seconds, detail)
        data = await self._call("POST", f"/v1/rollouts/{_q(rollout_id)}/attempts/{_q(attempt_id)}/finish", body)
        return Rollout.model_validate(data)

    async def retry(self, rollout_id: str) -> Rollout:
        return Rollout.model_validate(await self._call("POST", f"/v1/rollouts/{_q(rollout_id)}/retry"))

    async def post_event(self, rollout_id: str, attempt_id: str, event_type: str, data: Mapping[str, Any]) -> int:
        body = {"event_type": event_type, "data": dict(data)}
        answer = await self._call("POST", f"/v1/rollouts/{_q(rollout_id)}/attempts/{_q(attempt_id)}/events", body)
        return int(answer["event_id"])

    async def post_reward(self, rollout_id: str, attempt_id: str, value: float) -> int:
        return await self.post_event(rollout_id, attempt_id, "reward", {"value": value})

    async def calls(self, rollout_id: str, attempt_id: str | None = None) -> list[RecordedCall]:
        params = None if attempt_id is None else {"attempt_id": attempt_id}
        data = await self._call("GET", f"/v1/rollouts/{_q(rollout_id)}/calls", params=params)
        return [RecordedCall.model_validate(c) for c in data["calls"]]

    async def chat_completions(self, rollout_id: str, attempt_id: str, request: Mapping[str, Any]) -> dict[str, Any]:
        return await self._call(
            "POST", f"/v1/rollouts/{_q(rollout_id)}/attempts/{_q(attempt_id)}/v1/chat/completions", dict(request), timeout=_CHAT_TIMEOUT_S
        )

    async def put_models(self, model: str, endpoints: list[str], policy_version: int = 0) -> ModelRegistry:
        body = {"model": model, "endpoints": endpoints, "policy_version": policy_version}
        return ModelRegistry.model_validate(await self._call("PUT", "/v1/models", body))

    async def get_models(self) -> ModelRegistry:
        return ModelRegistry.model_validate(await self._call("GET", "/v1/models"))


__all__ = [
    "AsyncCalcxClient",
    "CalcxAPIError",
    "CalcxClient",
    "CalcxConnectionError",
]
