"""Events of an attempt (rewards and anything else an agent reports)."""

from __future__ import annotations

from typing import Any

from calcx.server.store.attempts import Attempts
from calcx.server.store.database import Database, dumps


class Events:
    def __init__(self, db: Database, attempts: Attempts) -> None:
        self._db = db
        self._attempts = attempts

    def add(self, rollout_id: str, attempt_id: str, event_type: str, data: dict[str, Any], reward: float | None) -> int:
        """Store an event on a RUNNING attempt; a reward also becomes the rollout's reward."""
        no = self._attempts.require_running(
            rollout_id, attempt_id, "; events are accepted only while the attempt is RUNNING"
        )
        now = self._db.clock()
        with self._db.tx() as db:
            cur = db.execute(
                "INSERT INTO events (rollout_id, attempt_no, event_type, data, created_at) VALUES (?,?,?,?,?)",
                (rollout_id, no, event_type, dumps(data), now),
            )
            if reward is not None:
                db.execute(
                    "UPDATE rollouts SET reward = ? WHERE rollout_id = ? AND latest_attempt = ?",
                    (reward, rollout_id, no),
                )
        return int(cur.lastrowid or 0)
