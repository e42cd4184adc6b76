"""Attempt tokens: bearer tokens that open only one attempt's gateway and events URLs.

`calcx-at.<rid>.<aid>.<hex hmac-sha256(key, "<rid>/<aid>")>`. The server can check one without
storing it, and an agent that leaks its token exposes only its own attempt.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

PREFIX = "calcx-at."
#: The shortest server key accepted: an attempt token is an HMAC of known text under the key, so
#: a short key could be guessed offline from any one token.
MIN_KEY_CHARS = 32
HOW_TO_MAKE_A_KEY = "make one with `export CALCX_KEY=$(calcx server --new-key)` (or `openssl rand -hex 32`)"


def new_key() -> str:
    """A fresh random server key (64 hex characters)."""
    return secrets.token_hex(32)


def key_problem(key: str) -> str | None:
    """Why ``key`` cannot be a server key (None when it can): empty, or shorter than MIN_KEY_CHARS."""
    if not key or not key.strip():
        return f"the server key is empty; {HOW_TO_MAKE_A_KEY}"
    if len(key) < MIN_KEY_CHARS:
        return (f"the server key has {len(key)} characters, fewer than {MIN_KEY_CHARS}: any attempt token would let "
                f"it be guessed offline; {HOW_TO_MAKE_A_KEY}")
    return None


@dataclass(frozen=True)
class AttemptScope:
    rollout_id: str
    attempt_id: str


def _mac(key: str, rollout_id: str, attempt_id: str) -> str:
    message = f"{rollout_id}/{attempt_id}".encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


def attempt_token(key: str, rollout_id: str, attempt_id: str) -> str:
    """The token an agent uses for attempt `attempt_id` of rollout `rollout_id`."""
    return f"{PREFIX}{rollout_id}.{attempt_id}.{_mac(key, rollout_id, attempt_id)}"


def verify_attempt_token(key: str, token: str) -> AttemptScope | None:
    """The attempt a token opens, or None when it is not a valid attempt token for `key`."""
    if not token.startswith(PREFIX):
        return None
    parts = token[len(PREFIX) :].rsplit(".", 2)
    if len(parts) != 3:
        return None
    rollout_id, attempt_id, mac = parts
    if not rollout_id or not attempt_id:
        return None
    if not hmac.compare_digest(mac.encode(), _mac(key, rollout_id, attempt_id).encode()):
        return None
    return AttemptScope(rollout_id, attempt_id)
