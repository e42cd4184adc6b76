"""Attempts: claims and leases, finishing, retries, and the cursor over terminal attempts.

A claim is atomic because it is one transaction on the event loop's thread (see the package
docstring): two controllers never get the same attempt.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from calcx.api.tokens import new_nonce
from calcx.contract.failures import FailureReason
from calcx.contract.labels import RUN_LABEL
from calcx.server.store.database import Conflict, Database, NotFound, parse_attempt_id
from calcx.server.store.run_leases import RunLeases

# ids per `IN (...)` query: well under SQLite's limit on bound parameters
_CHUNK = 500


@dataclass(frozen=True)
class ExpiredAttempt:
    rollout_id: str
    attempt_id: str
    controller_id: str | None


class Attempts:
    def __init__(self, db: Database, leases: RunLeases) -> None:
        self._db = db
        self._leases = leases

    def state(self, rollout_id: str, attempt_id: str) -> str:
        """The state of one attempt; NotFound names what is missing."""
        attempt_no = parse_attempt_id(attempt_id)
        row = None
        if attempt_no is not None:
            row = self._db.execute(
                "SELECT state FROM attempts WHERE rollout_id = ? AND attempt_no = ?", (rollout_id, attempt_no)
            ).fetchone()
        if row is None:
            self._db.require_rollout(rollout_id)
            raise NotFound(f"rollout {rollout_id!r} has no attempt {attempt_id!r}")
        return row[0]

    def require_running(self, rollout_id: str, attempt_id: str, refusal: str) -> int:
        """The attempt number of a RUNNING attempt; Conflict (ending in `refusal`) otherwise."""
        current = self.state(rollout_id, attempt_id)
        if current != "RUNNING":
            raise Conflict(f"attempt {attempt_id} of rollout {rollout_id!r} is {current}{refusal}")
        return int(attempt_id)

    def token_nonce(self, rollout_id: str, attempt_id: str) -> str | None:
        """The nonce the attempt's token is bound to (drawn at its claim); None for an attempt that
        does not exist or was never claimed."""
        attempt_no = parse_attempt_id(attempt_id)
        if attempt_no is None:
            return None
        row = self._db.execute(
            "SELECT token_nonce FROM attempts WHERE rollout_id = ? AND attempt_no = ?", (rollout_id, attempt_no)
        ).fetchone()
        return None if row is None else row[0]

    def claim(self, controller_id: str, max_count: int, lease_s: float) -> list[tuple[str, str]]:
        """Move up to `max_count` QUEUED rollouts (oldest first) to RUNNING for `controller_id`."""
        now = self._db.clock()
        lease_until = self._db.monotonic() + lease_s
        with self._db.tx() as db:
            picked = db.execute(
                "SELECT rollout_id, latest_attempt FROM rollouts WHERE state = 'QUEUED' ORDER BY seq LIMIT ?",
                (max_count,),
            ).fetchall()
            if not picked:
                return []
            db.executemany(
                "UPDATE attempts SET state = 'RUNNING', started_at = ?, controller_id = ?, lease_expires_at = ?, "
                "token_nonce = ? WHERE rollout_id = ? AND attempt_no = ?",
                [(now, controller_id, lease_until, new_nonce(), rid, no) for rid, no in picked],
            )
            db.executemany("UPDATE rollouts SET state = 'RUNNING' WHERE rollout_id = ?", [(rid,) for rid, _ in picked])
        return [(rid, str(no)) for rid, no in picked]

    def unclaim(self, controller_id: str, picked: Sequence[tuple[str, str]]) -> int:
        """Put claimed attempts back to QUEUED (their claimer went away before the answer)."""
        count = 0
        with self._db.tx() as db:
            for rid, aid in picked:
                cur = db.execute(
                    "UPDATE attempts SET state = 'QUEUED', started_at = NULL, controller_id = NULL, "
                    "lease_expires_at = NULL WHERE rollout_id = ? AND attempt_no = ? AND controller_id = ? "
                    "AND state = 'RUNNING'",
                    (rid, int(aid), controller_id),
                )
                if cur.rowcount:
                    db.execute("UPDATE rollouts SET state = 'QUEUED' WHERE rollout_id = ?", (rid,))
                    count += 1
        return count

    def heartbeat(
        self, controller_id: str, refs: Iterable[tuple[str, str]] | None, lease_s: float
    ) -> tuple[list[tuple[str, str]], list[tuple[str, str, str | None]]]:
        """Extend the leases a controller holds; returns (held, lost).

        With `refs` None every RUNNING attempt of the controller is extended. Otherwise only the
        listed ones, and those that are no longer RUNNING under this controller come back as lost
        (rid, aid, reason): the reason the attempt FAILED with under this controller (`cancelled`,
        `controller_lost`...), so the controller can tell a cancel from a lost lease; else None.
        """
        expires = self._db.monotonic() + lease_s
        with self._db.tx() as db:
            if refs is None:
                held = [
                    (rid, str(no))
                    for rid, no in db.execute(
                        "SELECT rollout_id, attempt_no FROM attempts WHERE controller_id = ? AND state = 'RUNNING'",
                        (controller_id,),
                    )
                ]
                db.execute(
                    "UPDATE attempts SET lease_expires_at = ? WHERE controller_id = ? AND state = 'RUNNING'",
                    (expires, controller_id),
                )
                return held, []
            held = []
            lost: list[tuple[str, str, str | None]] = []
            for rid, aid in refs:
                no = parse_attempt_id(aid)
                if (
                    no is not None
                    and db.execute(
                        "UPDATE attempts SET lease_expires_at = ? WHERE rollout_id = ? AND attempt_no = ? "
                        "AND controller_id = ? AND state = 'RUNNING'",
                        (expires, rid, no, controller_id),
                    ).rowcount
                    == 1
                ):
                    held.append((rid, aid))
                    continue
                row = (
                    None
                    if no is None
                    else db.execute(
                        "SELECT reason FROM attempts WHERE rollout_id = ? AND attempt_no = ? AND controller_id = ? "
                        "AND state = 'FAILED'",
                        (rid, no, controller_id),
                    ).fetchone()
                )
                lost.append((rid, aid, None if row is None else row[0]))
            return held, lost

    def finish(
        self,
        rollout_id: str,
        attempt_id: str,
        state: str,
        reason: str | None,
        exit_code: int | None,
        agent_seconds: float | None,
        detail: str | None,
    ) -> int:
        """RUNNING -> SUCCEEDED | FAILED for one attempt; returns its terminal cursor."""
        no = self.require_running(rollout_id, attempt_id, ", not RUNNING; only a running attempt can be finished")
        now = self._db.clock()
        with self._db.tx() as db:
            return _finish_locked(db, rollout_id, no, state, reason, exit_code, agent_seconds, detail, now)

    def retry(self, rollout_id: str, force: bool = False) -> str:
        """Queue a new attempt after a FAILED one; returns the new attempt id. One the cancel API
        ended (withdrawn work) only when `force`d; one a controller cancelled at its stop is
        retried like any other failure."""
        row = self._db.execute(
            "SELECT r.state, r.latest_attempt, r.spec, a.reason, a.detail FROM rollouts r JOIN attempts a "
            "ON a.rollout_id = r.rollout_id AND a.attempt_no = r.latest_attempt WHERE r.rollout_id = ?",
            (rollout_id,),
        ).fetchone()
        if row is None:
            raise NotFound(f"no rollout {rollout_id!r}")
        state, latest, spec, reason, detail = row
        max_attempts = json.loads(spec)["max_attempts"]
        if state != "FAILED":
            raise Conflict(f"rollout {rollout_id!r} is {state}; only a FAILED rollout can be retried")
        if reason == FailureReason.CANCELLED_BY_API and not force:
            raise Conflict(
                f"rollout {rollout_id!r} was cancelled through the cancel API ({detail}); its work was "
                "withdrawn and is not retried: retry with force to run it again"
            )
        if latest >= max_attempts:
            raise Conflict(f"rollout {rollout_id!r} already used {latest} of max_attempts={max_attempts} attempts")
        now = self._db.clock()
        with self._db.tx() as db:
            db.execute(
                "INSERT INTO attempts (rollout_id, attempt_no, state, created_at) VALUES (?,?,?,?)",
                (rollout_id, latest + 1, "QUEUED", now),
            )
            db.execute(
                "UPDATE rollouts SET state = 'QUEUED', latest_attempt = ?, reward = NULL WHERE rollout_id = ?",
                (latest + 1, rollout_id),
            )
        return str(latest + 1)

    def cancel(
        self, run: str | None, rollout_ids: Sequence[str] | None, detail: str, owner: str | None = None
    ) -> list[tuple[str, str]]:
        """FAIL (reason cancelled_by_api) the QUEUED and RUNNING latest attempts of the rollouts
        labelled `run`, or of `rollout_ids`; returns them. Terminal ones are left as they are. A
        cancel by run is fenced by the run's lease (`owner`, calcx.server.store.run_leases); a
        cancel by id that names an owner by the lease of each run it would cancel rollouts of, so a
        trainer taken over cannot withdraw its successor's work by id either."""
        now = self._db.clock()
        with self._db.tx() as db:
            if run is not None:
                self._leases.fence(db, run, owner)
                rows = db.execute(
                    "SELECT rollout_id, latest_attempt FROM rollouts WHERE state IN ('QUEUED', 'RUNNING') "
                    "AND json_extract(spec, ?) = ? ORDER BY seq",
                    (f'$.labels."{RUN_LABEL}"', run),
                ).fetchall()
            else:
                rows = []
                ids = list(dict.fromkeys(rollout_ids or ()))
                for start in range(0, len(ids), _CHUNK):
                    chunk = ids[start : start + _CHUNK]
                    marks = ",".join("?" * len(chunk))
                    rows += db.execute(
                        f"SELECT rollout_id, latest_attempt FROM rollouts WHERE state IN ('QUEUED', 'RUNNING') "
                        f"AND rollout_id IN ({marks}) ORDER BY seq",
                        chunk,
                    ).fetchall()
                if owner is not None:
                    for labelled in _runs_of(db, [rid for rid, _ in rows]):
                        self._leases.fence(db, labelled, owner)
            for rid, no in rows:
                _finish_locked(db, rid, no, "FAILED", FailureReason.CANCELLED_BY_API, None, None, detail, now)
        return [(rid, str(no)) for rid, no in rows]

    def expire_leases(self) -> list[ExpiredAttempt]:
        """FAIL (reason controller_lost) every RUNNING attempt whose lease has passed (on the
        monotonic clock: a wall-clock jump expires nothing)."""
        now = self._db.clock()
        rows = self._db.execute(
            "SELECT rollout_id, attempt_no, controller_id, lease_expires_at FROM attempts "
            "WHERE state = 'RUNNING' AND lease_expires_at < ?",
            (self._db.monotonic(),),
        ).fetchall()
        if not rows:
            return []
        with self._db.tx() as db:
            for rid, no, controller, expired_at in rows:
                detail = (
                    f"controller {controller!r} sent no heartbeat for this attempt; its lease expired at "
                    f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(self._db.wall_time(expired_at)))}"
                )
                _finish_locked(db, rid, no, "FAILED", FailureReason.CONTROLLER_LOST, None, None, detail, now)
        return [ExpiredAttempt(rid, str(no), controller) for rid, no, controller, _ in rows]

    def renew_running_leases(self, lease_s: float) -> int:
        """At startup: give every RUNNING attempt a fresh lease so live controllers can heartbeat.
        (A deadline stored by an earlier process is on that process's monotonic clock, which a
        reboot restarts: it is replaced, not compared.)"""
        with self._db.tx() as db:
            cur = db.execute(
                "UPDATE attempts SET lease_expires_at = ? WHERE state = 'RUNNING'",
                (self._db.monotonic() + lease_s,),
            )
            return cur.rowcount

    def terminal_after(self, cursor: int, limit: int) -> list[tuple[int, str, str]]:
        """(cursor, rollout id, attempt id) of attempts that became terminal after `cursor`."""
        return [
            (c, rid, str(no))
            for c, rid, no in self._db.execute(
                "SELECT cursor, rollout_id, attempt_no FROM terminal WHERE cursor > ? ORDER BY cursor LIMIT ?",
                (cursor, limit),
            )
        ]


def _finish_locked(
    db: sqlite3.Connection,
    rollout_id: str,
    attempt_no: int,
    state: str,
    reason: str | None,
    exit_code: int | None,
    agent_seconds: float | None,
    detail: str | None,
    now: float,
) -> int:
    """Inside a transaction: the attempt's terminal state, the rollout's, and a terminal cursor."""
    db.execute(
        "UPDATE attempts SET state = ?, finished_at = ?, reason = ?, exit_code = ?, agent_seconds = ?, "
        "detail = ?, lease_expires_at = NULL WHERE rollout_id = ? AND attempt_no = ?",
        (state, now, reason, exit_code, agent_seconds, detail, rollout_id, attempt_no),
    )
    db.execute(
        "UPDATE rollouts SET state = ? WHERE rollout_id = ? AND latest_attempt = ?",
        (state, rollout_id, attempt_no),
    )
    cur = db.execute(
        "INSERT INTO terminal (rollout_id, attempt_no, created_at) VALUES (?,?,?)", (rollout_id, attempt_no, now)
    )
    return int(cur.lastrowid or 0)


def _runs_of(db: sqlite3.Connection, rollout_ids: Sequence[str]) -> list[str]:
    """The distinct run labels (`labels.run`) of these rollouts, unlabelled ones left out."""
    runs: set[str] = set()
    for start in range(0, len(rollout_ids), _CHUNK):
        chunk = list(rollout_ids[start : start + _CHUNK])
        marks = ",".join("?" * len(chunk))
        runs.update(
            run
            for (run,) in db.execute(
                f"SELECT DISTINCT json_extract(spec, ?) FROM rollouts WHERE rollout_id IN ({marks})",
                [f'$.labels."{RUN_LABEL}"', *chunk],
            )
            if isinstance(run, str)
        )
    return sorted(runs)
