"""Run leases: which trainer process (its owner id) holds a run name, until when.

A trainer takes its run's lease before it cancels or rewinds anything of the run and renews it
while it runs; a second trainer with the same run name is refused while the lease is live, unless
it takes the run over. The writes a trainer makes for its run (training ledger, rewind, cancel by
run) name its owner id and are refused once another owner holds the row: a trainer that was taken
over is fenced off, whatever its clock or its lease says. The row stays after a release or a lapse,
so its last owner stays fenced until another trainer takes the run.

Expiry runs on the server's monotonic clock, like the claims' leases; a restarted server gives a
fresh lease to the rows renewed within one lease length before it started (by wall time).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from typing import Any

from calcx.server.store.database import Database, LeaseHeld, LeaseLimit, LeaseLost

_COLUMNS = "run, owner, acquired_at, renewed_at, expires_at, released_at, previous_owner"


def _stamp(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


class RunLeases:
    def __init__(self, db: Database) -> None:
        self._db = db

    def acquire(self, run: str, owner: str, take_over: bool, lease_s: float, max_leases: int) -> dict[str, Any]:
        """Take `run` for `owner`: refused (LeaseHeld) while another owner's lease is live, unless
        `take_over`; the same owner again renews. Past `max_leases` rows, ended leases make room."""
        db = self._db
        now, mono = db.clock(), db.monotonic()
        took_over = False
        with db.tx() as conn:
            row = _row(conn, run)
            if row is None:
                _insert(conn, run, owner, now, mono, lease_s, max_leases)
            elif row[1] == owner:
                conn.execute(
                    "UPDATE run_leases SET renewed_at = ?, expires_at = ?, released_at = NULL " "WHERE run = ?",
                    (now, mono + lease_s, run),
                )
            else:
                live = _live(row, mono)
                if live and not take_over:
                    raise LeaseHeld(
                        f"run {run!r} is held by trainer {row[1]!r} (renewed at {_stamp(row[3])}); its lease lapses "
                        f"at {_stamp(db.wall_time(row[4]))} unless renewed. Another calcx train of this run is "
                        "running: use another run name, stop that one, or take the run over (--take-over), "
                        "which fences that trainer off"
                    )
                took_over = live
                conn.execute(
                    "UPDATE run_leases SET owner = ?, acquired_at = ?, renewed_at = ?, expires_at = ?, "
                    "released_at = NULL, previous_owner = ? WHERE run = ?",
                    (owner, now, now, mono + lease_s, row[1], run),
                )
            lease = self._view(_row(conn, run), lease_s)
        lease["took_over"] = took_over
        return lease

    def renew(self, run: str, owner: str, lease_s: float, max_leases: int) -> dict[str, Any]:
        """Extend `owner`'s lease; LeaseLost once another owner holds the run. A row that is gone
        (ended and pruned) is taken again, as nobody else holds it."""
        db = self._db
        now, mono = db.clock(), db.monotonic()
        with db.tx() as conn:
            row = _row(conn, run)
            if row is None:
                _insert(conn, run, owner, now, mono, lease_s, max_leases)
            elif row[1] != owner:
                raise self._lost(row, run, owner)
            else:
                conn.execute(
                    "UPDATE run_leases SET renewed_at = ?, expires_at = ?, released_at = NULL " "WHERE run = ?",
                    (now, mono + lease_s, run),
                )
            return self._view(_row(conn, run), lease_s)

    def release(self, run: str, owner: str, lease_s: float) -> dict[str, Any] | None:
        """End `owner`'s lease now (a clean end of its run); the row keeps its owner, so a later
        start needs no take-over and a copy of the old trainer still cannot write. None when no row."""
        db = self._db
        with db.tx() as conn:
            row = _row(conn, run)
            if row is None:
                return None
            if row[1] != owner:
                raise self._lost(row, run, owner)
            conn.execute(
                "UPDATE run_leases SET released_at = ?, expires_at = ? WHERE run = ?", (db.clock(), db.monotonic(), run)
            )
            return self._view(_row(conn, run), lease_s)

    def fence(self, conn: sqlite3.Connection, run: str, owner: str | None) -> None:
        """Inside a write for `run`: LeaseLost unless the writer may write. A run nobody leased, or
        whose holder it is, may; a request without an owner may only while no lease is live."""
        row = _row(conn, run)
        if row is None or row[1] == owner:
            return
        if owner is None and not _live(row, self._db.monotonic()):
            return
        raise self._lost(row, run, owner)

    def renew_after_restart(self, lease_s: float) -> int:
        """At startup: a fresh lease for each row renewed (by wall time) within one lease length,
        the others ended. (Deadlines stored by an earlier process are on its monotonic clock.)"""
        db = self._db
        mono, cutoff = db.monotonic(), db.clock() - lease_s
        with db.tx() as conn:
            renewed = conn.execute(
                "UPDATE run_leases SET expires_at = ? WHERE released_at IS NULL AND renewed_at >= ?",
                (mono + lease_s, cutoff),
            ).rowcount
            conn.execute(
                "UPDATE run_leases SET expires_at = ? WHERE released_at IS NOT NULL OR renewed_at < ?", (mono, cutoff)
            )
        return renewed

    def _lost(self, row: Sequence[Any], run: str, owner: str | None) -> LeaseLost:
        state = ("live" if _live(row, self._db.monotonic()) else "ended") + f", renewed at {_stamp(row[3])}"
        writer = f"trainer {owner!r}" if owner is not None else "a request naming no owner"
        return LeaseLost(
            f"run {run!r} is held by trainer {row[1]!r} (lease {state}); {writer} does not hold it and "
            "may not write for it: it was taken over, or the run is running elsewhere"
        )

    def _view(self, row: Sequence[Any] | None, lease_s: float) -> dict[str, Any]:
        assert row is not None
        return {
            "run": row[0],
            "owner": row[1],
            "acquired_at": row[2],
            "renewed_at": row[3],
            "expires_at": self._db.wall_time(row[4]),
            "released_at": row[5],
            "previous_owner": row[6],
            "lease_s": lease_s,
            "live": _live(row, self._db.monotonic()),
        }


def _row(conn: sqlite3.Connection, run: str) -> tuple[Any, ...] | None:
    return conn.execute(f"SELECT {_COLUMNS} FROM run_leases WHERE run = ?", (run,)).fetchone()


def _live(row: Sequence[Any], mono: float) -> bool:
    return row[5] is None and row[4] > mono


def _insert(
    conn: sqlite3.Connection, run: str, owner: str, now: float, mono: float, lease_s: float, max_leases: int
) -> None:
    """A new lease row for `run`, held by `owner` from now, after making room past `max_leases`."""
    _make_room(conn, mono, max_leases)
    conn.execute(
        f"INSERT INTO run_leases ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, NULL, NULL)",
        (run, owner, now, now, mono + lease_s),
    )


def _make_room(conn: sqlite3.Connection, mono: float, max_leases: int) -> None:
    """Room for one more row: past `max_leases`, the ended leases (released or lapsed) renewed
    longest ago go; LeaseLimit when every row is live."""
    (count,) = conn.execute("SELECT COUNT(*) FROM run_leases").fetchone()
    excess = count - max_leases + 1
    if excess <= 0:
        return
    conn.execute(
        "DELETE FROM run_leases WHERE run IN (SELECT run FROM run_leases WHERE released_at IS NOT NULL "
        "OR expires_at <= ? ORDER BY renewed_at LIMIT ?)",
        (mono, excess),
    )
    (count,) = conn.execute("SELECT COUNT(*) FROM run_leases").fetchone()
    if count >= max_leases:
        raise LeaseLimit(
            f"the server holds {count} live run leases, its limit (--max-run-leases {max_leases}); "
            "a run's lease ends when its trainer stops or stops renewing it"
        )
