"""Events of an attempt (rewards and anything else an agent reports)."""

from __future__ import annotations

from typing import Any

from calcx.server.store.attempts import Attempts
from calcx.server.store.database import Database, LimitReached, dumps


class Events:
    def __init__(self, db: Database, attempts: Attempts) -> None:
        self._db = db
        self._attempts = attempts

    def add(
        self,
        rollout_id: str,
        attempt_id: str,
        event_type: str,
        data: dict[str, Any],
        reward: float | None,
        *,
        max_count: int,
        max_bytes: int,
    ) -> int:
        """Store an event on a RUNNING attempt; a reward also becomes the rollout's reward.
        LimitReached when the attempt holds `max_count` events, or this one would take its
        events' data past `max_bytes`."""
        no = self._attempts.require_running(
            rollout_id, attempt_id, "; events are accepted only while the attempt is RUNNING"
        )
        now = self._db.clock()
        text = dumps(data)
        with self._db.tx() as db:
            count, size = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(LENGTH(CAST(data AS BLOB))), 0) FROM events "
                "WHERE rollout_id = ? AND attempt_no = ?",
                (rollout_id, no),
            ).fetchone()
            added = len(text.encode())
            if count >= max_count or size + added > max_bytes:
                raise LimitReached(
                    f"attempt {attempt_id} of rollout {rollout_id!r} holds {count} events ({size} bytes of data); one "
                    f"attempt may post at most {max_count} events and {max_bytes} bytes (this one: {added} bytes)"
                )
            cur = db.execute(
                "INSERT INTO events (rollout_id, attempt_no, event_type, data, created_at) VALUES (?,?,?,?,?)",
                (rollout_id, no, event_type, text, now),
            )
            if reward is not None:
                db.execute(
                    "UPDATE rollouts SET reward = ? WHERE rollout_id = ? AND latest_attempt = ?",
                    (reward, rollout_id, no),
                )
        return int(cur.lastrowid or 0)
