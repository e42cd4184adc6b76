"""Attempt tokens: bearer tokens that open only one attempt's gateway and events URLs.

`calcx-at.<rid>.<aid>.<hex hmac-sha256(key, "<rid>/<aid>")>`. The server can check one without
storing it, and an agent that leaks its token exposes only its own attempt.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

PREFIX = "calcx-at."


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
