"""Posting the reward event (Agent Lightning v1: ``POST $AGL_EVENT_URL``)."""

from __future__ import annotations

import asyncio
import math

import httpx

from calcx.agent.failures import RewardPostFailed

POST_ATTEMPTS = 4
FIRST_BACKOFF_S = 0.25
REQUEST_TIMEOUT_S = 15.0


def reward_event(value: float) -> dict:
    """The event body the server expects for a reward."""
    if not math.isfinite(value):
        raise ValueError(f"reward must be a finite number, got {value!r}")
    return {"event_type": "reward", "data": {"value": float(value)}}


async def post_reward(event_url: str, key: str, value: float, *, attempts: int = POST_ATTEMPTS) -> dict:
    """POST the reward with the bearer key; retry connection errors and 5xx, fail on 4xx.

    Returns the server's JSON answer; raises RewardPostFailed when the reward was not stored.
    """
    body = reward_event(value)
    headers = {"Authorization": f"Bearer {key}"}
    backoff = FIRST_BACKOFF_S
    last_problem = "no attempt made"
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
        for attempt in range(1, attempts + 1):
            try:
                response = await client.post(event_url, json=body, headers=headers)
            except httpx.TransportError as exc:
                last_problem = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code < 300:
                    try:
                        return response.json()
                    except ValueError:
                        return {}
                last_problem = f"HTTP {response.status_code}: {response.text[:300]}"
                if response.status_code < 500 and response.status_code not in (408, 429):
                    raise RewardPostFailed(f"event endpoint {event_url} refused the reward ({last_problem})")
            if attempt < attempts:
                await asyncio.sleep(backoff)
                backoff *= 2
    raise RewardPostFailed(f"could not post the reward to {event_url} after {attempts} attempts ({last_problem})")
