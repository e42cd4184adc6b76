"""Rollout store on SQLite: rollouts, attempts, events, recorded calls, the model registry, retention,
the training ledger, the runs' leases.

One connection (`database`), one module per group of tables. Every method is synchronous,
short and runs on the event loop's thread; the loop therefore serialises them and no
transaction ever spans an `await`, which is what makes a claim atomic. (sqlite3's
`check_same_thread` guards against use from another thread.)
"""

from __future__ import annotations

import time
from collections.abc import Callable

from calcx.server.store.attempts import Attempts, ExpiredAttempt
from calcx.server.store.calls import CallRecord, Calls
from calcx.server.store.database import Conflict, Database, NotFound, StoreError
from calcx.server.store.events import Events
from calcx.server.store.registry import Registry
from calcx.server.store.retention import Retention
from calcx.server.store.rollouts import Rollouts
from calcx.server.store.run_leases import RunLeases
from calcx.server.store.trained import Trained

__all__ = ["CallRecord", "Conflict", "ExpiredAttempt", "NotFound", "RolloutStore", "StoreError"]


class RolloutStore:
    """Persistent rollout state, one attribute per group of tables."""

    def __init__(
        self, path: str, clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = path
        self._db = Database(path, clock, monotonic)
        self.rollouts = Rollouts(self._db)
        self.leases = RunLeases(self._db)
        self.attempts = Attempts(self._db, self.leases)
        self.events = Events(self._db, self.attempts)
        self.calls = Calls(self._db)
        self.registry = Registry(self._db)
        self.retention = Retention(self._db)
        self.trained = Trained(self._db, self.leases)

    def close(self) -> None:
        self._db.close()

    def write_problem(self) -> str | None:
        """Why the store cannot write now (a committed write of one row), or None."""
        return self._db.write_problem()
