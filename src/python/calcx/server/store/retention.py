"""Retention: terminal rollouts older than the server's `retain_s` are deleted with everything
recorded for them, and run leases that ended before it, so a long run's database stays bounded."""

from __future__ import annotations

from calcx.server.store.database import Database

#: Rollouts deleted per transaction: a large backlog is pruned in short steps.
PRUNE_BATCH = 500


class Retention:
    def __init__(self, db: Database) -> None:
        self._db = db

    def prune(self, older_than_s: float) -> int:
        """Delete every rollout whose latest attempt ended (SUCCEEDED or FAILED) more than
        `older_than_s` ago, with its attempts, events, recorded calls, terminal entries and training records.
        QUEUED and RUNNING rollouts stay, however old: their latest attempt has not finished.
        Returns how many rollouts went. Run leases that ended (released or lapsed) and were last
        renewed before the cutoff go too."""
        cutoff = self._db.clock() - older_than_s
        with self._db.tx() as db:
            db.execute(
                "DELETE FROM run_leases WHERE renewed_at < ? AND (released_at IS NOT NULL OR expires_at <= ?)",
                (cutoff, self._db.monotonic()),
            )
        total = 0
        while True:
            with self._db.tx() as db:
                ids = [
                    row[0]
                    for row in db.execute(
                        "SELECT r.rollout_id FROM rollouts r JOIN attempts a "
                        "ON a.rollout_id = r.rollout_id AND a.attempt_no = r.latest_attempt "
                        "WHERE a.finished_at < ? LIMIT ?",
                        (cutoff, PRUNE_BATCH),
                    )
                ]
                if not ids:
                    return total
                marks = ",".join("?" * len(ids))
                for table in ("events", "calls", "terminal", "trained", "attempts", "rollouts"):
                    db.execute(f"DELETE FROM {table} WHERE rollout_id IN ({marks})", ids)  # noqa: S608 - fixed names
            total += len(ids)
