"""The rollout the trainer asks the calcx server for: its deterministic id and its `RolloutCreate`
body (docs/architecture.md). JSON only, so that the request is the same from verl's workers and
from the eval-only driver."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def rollout_id_for(partition: str, step: int, uid: str, session_id: int) -> str:
    """Deterministic rollout id: the same verl sample always names the same rollout (idempotent)."""
    return f"calcx-{partition}-s{step}-{uid}-{session_id}"


def rollout_create_body(
    *,
    rollout_id: str,
    group_id: str,
    row: Mapping[str, Any],
    policy_version: int,
    env_map: Mapping[str, str] | None,
    deadline_s: float,
    max_attempts: int,
    labels: Mapping[str, str],
    sampling: Mapping[str, float | int] | None = None,
) -> dict[str, Any]:
    """A `RolloutCreate` as JSON (docs/architecture.md)."""
    body: dict[str, Any] = {
        "rollout_id": rollout_id,
        "group_id": group_id,
        "row": dict(row),
        "env_map": dict(env_map) if env_map is not None else None,
        "deadline_s": float(deadline_s),
        "max_attempts": int(max_attempts),
        "policy_version": int(policy_version),
        "labels": {str(k): str(v) for k, v in labels.items()},
    }
    if sampling is not None:
        body["sampling"] = dict(sampling)
    return body
