"""The store's one SQLite connection, its transactions, and the errors every table refuses with."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from calcx.api.errors import LEASE_LIMIT, LEASE_LOST, RUN_LEASED
from calcx.server.store.schema import ADDED_COLUMNS, SCHEMA

#: How long a statement waits for another connection's write lock (ms).
BUSY_TIMEOUT_MS = 5000
#: ... and the health probe's write, which answers a load balancer rather than a caller's request.
PROBE_BUSY_MS = 200


class StoreError(Exception):
    """A request the store refuses; `code` is the API error code."""

    status = 400
    code = "bad_request"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(StoreError):
    status = 404
    code = "not_found"


class Conflict(StoreError):
    status = 409
    code = "conflict"


class LimitReached(StoreError):
    """An attempt has stored as much as one attempt may (events or recorded calls)."""

    status = 413
    code = "attempt_limit"


class LeaseHeld(StoreError):
    """Another trainer holds the run's lease and renews it: a second start is refused unless it
    takes the run over."""

    status = 409
    code = RUN_LEASED


class LeaseLost(StoreError):
    """A write for a run whose lease another trainer now holds (the writer was taken over)."""

    status = 409
    code = LEASE_LOST


class LeaseLimit(StoreError):
    """The store holds as many live run leases as it may."""

    status = 409
    code = LEASE_LIMIT


class Database:
    """WAL journal, `synchronous=NORMAL`: a committed transaction survives a crash of the server
    process (only an OS crash or power loss can undo the last commits).

    Two clocks: `clock` (wall time) stamps what a person reads (created_at, finished_at);
    `monotonic` times leases, so that a wall-clock jump (NTP, a VM resumed) never expires or
    stretches one. Lease deadlines are monotonic seconds of this process, renewed at startup."""

    def __init__(
        self, path: str, clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = path
        self.clock = clock
        self.monotonic = monotonic
        _owner_only(path)
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=True)
        mode = str(self.conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]).lower()
        if mode != "wal":
            self.conn.close()
            raise StoreError(
                f"SQLite kept journal_mode={mode} for {path!r} (WAL was asked for): the store needs WAL for "
                "readers beside the writer and for its crash guarantees; put the database on a local file "
                "system (WAL does not work on network file systems or in memory)"
            )
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute("PRAGMA foreign_keys=OFF")
        self.conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        self.conn.execute("PRAGMA cache_size=-32000")
        self.conn.executescript(SCHEMA)
        for table, column, declaration in ADDED_COLUMNS:
            if column not in {row[1] for row in self.conn.execute(f"PRAGMA table_info({table})")}:
                self.conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")

    def close(self) -> None:
        self.conn.close()

    def execute(self, sql: str, args: Any = ()) -> sqlite3.Cursor:
        """A statement outside a transaction (reads, and single-statement writes)."""
        return self.conn.execute(sql, args)

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction. A COMMIT that fails (disk full, I/O error, a deferred
        constraint) leaves SQLite's transaction open; it is rolled back, so the one connection is
        never wedged inside it (every later BEGIN would fail) and nothing half-done is kept."""
        db = self.conn
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        try:
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def write_problem(self) -> str | None:
        """Why the store cannot write now (None when it can): one small committed write (the
        `health_probe` row of `kv`), waiting at most PROBE_BUSY_MS for another writer's lock
        instead of the usual busy timeout, so a probe never holds the server's loop for long."""
        try:
            self.conn.execute(f"PRAGMA busy_timeout={PROBE_BUSY_MS}")
            try:
                with self.tx() as db:
                    db.execute(
                        "INSERT INTO kv (key, value) VALUES ('health_probe', ?) "
                        "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                        (repr(self.clock()),),
                    )
            finally:
                self.conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        except sqlite3.Error as exc:
            return f"the store cannot write: {type(exc).__name__}: {exc}"
        return None

    def wall_time(self, monotonic_time: float) -> float:
        """A monotonic instant of this process (a lease deadline) as wall time, for people."""
        return self.clock() + (monotonic_time - self.monotonic())

    def require_rollout(self, rollout_id: str) -> None:
        if self.execute("SELECT 1 FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone() is None:
            raise NotFound(f"no rollout {rollout_id!r}")


#: The mode of the store's files: they hold every request, answer and reward of every rollout.
STORE_FILE_MODE = 0o600


def _owner_only(path: str) -> None:
    """Create the database file owner-only before SQLite opens it (its journal and WAL files take
    the database file's mode), and take group and other access from one made earlier."""
    if path == ":memory:" or path.startswith("file:") or not path:
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, STORE_FILE_MODE)
    os.close(fd)
    for name in (path, f"{path}-wal", f"{path}-shm", f"{path}-journal"):
        if os.path.exists(name):
            os.chmod(name, stat.S_IMODE(os.stat(name).st_mode) & STORE_FILE_MODE)


def parse_attempt_id(attempt_id: str) -> int | None:
    """Attempt ids are "1", "2", ... in the API and integers in the tables. Only ASCII digits:
    `str.isdigit` also takes digits `int` cannot read, such as "²"."""
    if not attempt_id.isascii() or not attempt_id.isdigit() or len(attempt_id) > 9:
        return None
    return int(attempt_id)


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
