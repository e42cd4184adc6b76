"""The few calcx server calls the trainer makes, over httpx (docs/architecture.md, HTTP API)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import httpx


class ServerError(RuntimeError):
    """The calcx server answered with an error, or could not be reached."""

    def __init__(self, status: int, code: str, message: str) -> None:
        self.status, self.code, self.message = status, code, message
        super().__init__(f"calcx server: {status} {code}: {message}")


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        err = response.json().get("error", {})
        code, message = str(err.get("code", "error")), str(err.get("message", response.text))
    except ValueError:
        code, message = "error", response.text[:500]
    raise ServerError(response.status_code, code, message)


class TrainerServerClient:
    """Async client: rollouts (create, wait, retry, calls) and the model registry."""

    def __init__(self, base_url: str, key: str, *, timeout_s: float = 30.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._timeout_s = timeout_s
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=timeout_s,
                                       transport=transport)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(self, method: str, path: str, *, json: Any = None, params: Any = None,
                       timeout: float | None = None) -> Any:
        try:
            response = await self._http.request(method, path, json=json, params=params,
                                                 timeout=timeout if timeout is not None else self._timeout_s)
        except httpx.HTTPError as exc:
            raise ServerError(0, "unreachable", f"{method} {self.base_url}{path}: {exc!r}") from exc
        _raise_for(response)
        return response.json()

    async def create_rollouts(self, bodies: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        return (await self._request("POST", "/v1/rollouts", json={"rollouts": list(bodies)}))["rollouts"]

    async def get_rollout(self, rollout_id: str) -> dict[str, Any]:
        return await self._request("GET", f"/v1/rollouts/{rollout_id}")

    async def wait(self, rollout_id: str, timeout_s: float) -> dict[str, Any]:
        """Long poll: returns once the rollout is terminal, or its current state after timeout_s."""
        return await self._request("POST", f"/v1/rollouts/{rollout_id}/wait", json={"timeout_s": timeout_s},
                                   timeout=timeout_s + 15.0)

    async def retry(self, rollout_id: str) -> dict[str, Any]:
        return await self._request("POST", f"/v1/rollouts/{rollout_id}/retry")

    async def calls(self, rollout_id: str) -> list[dict[str, Any]]:
        return (await self._request("GET", f"/v1/rollouts/{rollout_id}/calls"))["calls"]

    async def list_rollouts(self, *, state: str | None = None, limit: int = 1000,
                            offset: int = 0) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if state:
            params["state"] = state
        return (await self._request("GET", "/v1/rollouts", params=params))["rollouts"]

    async def all_rollouts(self, *, page: int = 1000) -> list[dict[str, Any]]:
        """Every rollout on the server, in creation order (paged)."""
        out: list[dict[str, Any]] = []
        while True:
            batch = await self.list_rollouts(limit=page, offset=len(out))
            out.extend(batch)
            if len(batch) < page:
                return out

    async def put_models(self, model: str, endpoints: list[str], policy_version: int) -> dict[str, Any]:
        body = {"model": model, "endpoints": endpoints, "policy_version": int(policy_version)}
        return await self._request("PUT", "/v1/models", json=body)
