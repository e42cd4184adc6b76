"""Posting the reward event (Agent Lightning v1: ``POST $AGL_EVENT_URL``) through the calcx client."""

from __future__ import annotations

import asyncio
import math

from calcx.agent.failures import RewardPostFailed
from calcx.api.client import AsyncCalcxClient, CalcxAPIError

POST_ATTEMPTS = 4
FIRST_BACKOFF_S = 0.25
REQUEST_TIMEOUT_S = 15.0


def reward_event(value: float) -> dict:
    """The event body the server expects for a reward."""
    if not math.isfinite(value):
        raise ValueError(f"reward must be a finite number, got {value!r}")
    return {"event_type": "reward", "data": {"value": float(value)}}


def _retriable(exc: CalcxAPIError) -> bool:
    """No answer, a server error, or 408/429: the reward may be stored on a later try."""
    return exc.unreachable or exc.status >= 500 or exc.status in (408, 429)


async def post_reward(event_url: str, key: str, value: float, *, attempts: int = POST_ATTEMPTS) -> dict:
    """POST the reward with the bearer key; retry connection errors and 5xx, fail on 4xx.

    Returns the server's answer (`{"event_id": ...}`); raises RewardPostFailed when the reward
    was not stored.
    """
    event = reward_event(value)
    backoff = FIRST_BACKOFF_S
    last_problem = "no attempt made"
    async with AsyncCalcxClient(event_url, key, timeout=REQUEST_TIMEOUT_S) as client:
        for attempt in range(1, attempts + 1):
            try:
                return {"event_id": await client.post_event_to(event_url, event["event_type"], event["data"])}
            except CalcxAPIError as exc:
                if 200 <= exc.status < 300:
                    return {}  # stored; only the answer was not the usual {"event_id": ...}
                last_problem = exc.message if exc.unreachable else f"HTTP {exc.status} {exc.code}: {exc.message}"
                if not _retriable(exc):
                    raise RewardPostFailed(f"event endpoint {event_url} refused the reward ({last_problem})") from None
            if attempt < attempts:
                await asyncio.sleep(backoff)
                backoff *= 2
    raise RewardPostFailed(f"could not post the reward to {event_url} after {attempts} attempts ({last_problem})")
