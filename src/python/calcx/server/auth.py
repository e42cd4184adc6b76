"""Bearer auth: the server key opens everything, an attempt token only its own attempt's URLs.

Each endpoint of `calcx.api.endpoints` names its `Auth`; `audience_for` turns it into the check
that runs before the endpoint's handler (calcx.server.routing).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from fastapi import Request

from calcx.api.endpoints import Auth
from calcx.api.tokens import AttemptScope, key_problem, verify_attempt_token
from calcx.server.errors import APIError

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="calcx"'}


def request_token(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if header:
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return None
    api_key = request.headers.get("x-api-key")
    return api_key.strip() if api_key else None


#: The nonce an attempt's token is bound to, from the store (None: no such attempt, or unclaimed).
NonceOf = Callable[[str, str], "str | None"]


class Authenticator:
    def __init__(self, key: str, nonce_of: NonceOf) -> None:
        problem = key_problem(key)
        if problem is not None:
            raise ValueError(problem)
        self._key = key
        self._key_bytes = key.encode()
        self._nonce_of = nonce_of

    def _identify(self, request: Request) -> AttemptScope | None:
        """None for the server key, the scope for an attempt token; 401 otherwise."""
        token = request_token(request)
        if token is None:
            raise APIError(
                401,
                "unauthorized",
                "missing credentials: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                _CHALLENGE,
            )
        if hmac.compare_digest(token.encode(), self._key_bytes):
            return None
        scope = verify_attempt_token(self._key, token)
        if scope is None:
            raise APIError(
                401, "unauthorized", "unknown credentials: the key or attempt token is not valid", _CHALLENGE
            )
        current = self._nonce_of(scope.rollout_id, scope.attempt_id)
        if current is None or not hmac.compare_digest(scope.nonce.encode(), current.encode()):
            raise APIError(
                401,
                "unauthorized",
                f"this attempt token is not that of the current attempt {scope.attempt_id} of rollout "
                f"{scope.rollout_id!r}: it was minted for an earlier one under those ids (a rollout deleted by "
                "retention and created again, or a claim given back)",
                _CHALLENGE,
            )
        return scope

    def require_server_key(self, request: Request) -> None:
        scope = self._identify(request)
        if scope is not None:
            raise APIError(
                403,
                "forbidden",
                "an attempt token opens only its own attempt's gateway and events URLs; this endpoint needs the "
                "server key",
            )

    def require_attempt(self, request: Request, rollout_id: str, attempt_id: str) -> None:
        """Server key, or the attempt token of exactly this rollout and attempt."""
        scope = self._identify(request)
        if scope is None:
            return
        if scope.rollout_id != rollout_id or scope.attempt_id != attempt_id:
            raise APIError(
                403,
                "forbidden",
                f"this attempt token is for rollout {scope.rollout_id!r} attempt {scope.attempt_id}, not rollout "
                f"{rollout_id!r} attempt {attempt_id}",
            )


#: Who may call an endpoint: checked before its handler runs; raises 401 or 403.
Audience = Callable[[Authenticator, Request], None]


def server_key(auth: Authenticator, request: Request) -> None:
    """Trainers, controllers, the rehearsal: the server key itself."""
    auth.require_server_key(request)


def own_attempt(auth: Authenticator, request: Request) -> None:
    """An agent: the attempt token of the `{rid}` and `{aid}` in the path (or the server key)."""
    params = request.path_params
    auth.require_attempt(request, params["rid"], params["aid"])


def audience_for(auth: Auth) -> Audience | None:
    """The check for an endpoint's declared `Auth` (None: open to anyone)."""
    if auth is Auth.OPEN:
        return None
    if auth is Auth.SERVER_KEY:
        return server_key
    if auth is Auth.ATTEMPT:
        return own_attempt
    raise ValueError(f"no audience for {auth!r}")
