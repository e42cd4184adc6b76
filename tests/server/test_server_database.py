"""The store's SQLite connection: WAL is checked at start, and a failed COMMIT is rolled back."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from calcx.server.store.database import Database, StoreError


def test_a_failed_commit_is_rolled_back_and_the_connection_stays_usable(tmp_path: Path) -> None:
    """A deferred foreign key fails at COMMIT, as a full disk or an I/O error would: SQLite leaves
    the transaction open, and unrolled it would wedge the server's one connection."""
    db = Database(str(tmp_path / "calcx.db"))
    db.execute("PRAGMA foreign_keys=ON")
    db.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
    db.execute("CREATE TABLE child (pid INTEGER REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED)")
    with pytest.raises(sqlite3.IntegrityError):
        with db.tx() as tx:
            tx.execute("INSERT INTO child (pid) VALUES (7)")
    assert not db.conn.in_transaction
    assert db.execute("SELECT COUNT(*) FROM child").fetchone() == (0,)  # nothing half-done kept
    with db.tx() as tx:  # the next transaction begins and commits
        tx.execute("INSERT INTO parent (id) VALUES (7)")
        tx.execute("INSERT INTO child (pid) VALUES (7)")
    assert db.execute("SELECT COUNT(*) FROM child").fetchone() == (1,)


def test_a_database_that_cannot_use_wal_is_refused_with_a_clear_error() -> None:
    with pytest.raises(StoreError, match="journal_mode=memory.*WAL"):
        Database(":memory:")


def test_the_store_runs_in_wal_mode(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "calcx.db"))
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_a_database_from_before_the_token_nonce_gets_the_column(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.execute(
        "CREATE TABLE attempts (rollout_id TEXT NOT NULL, attempt_no INTEGER NOT NULL, state TEXT NOT NULL, "
        "created_at REAL NOT NULL, started_at REAL, finished_at REAL, controller_id TEXT, reason TEXT, "
        "exit_code INTEGER, agent_seconds REAL, detail TEXT, lease_expires_at REAL, "
        "PRIMARY KEY (rollout_id, attempt_no)) WITHOUT ROWID"
    )
    old.execute("INSERT INTO attempts (rollout_id, attempt_no, state, created_at) VALUES ('r', 1, 'QUEUED', 0)")
    old.commit()
    old.close()
    db = Database(str(path))
    try:
        assert db.execute("SELECT rollout_id, token_nonce FROM attempts").fetchall() == [("r", None)]
    finally:
        db.close()


def test_the_store_and_its_wal_are_owner_only(tmp_path: Path) -> None:
    old_umask = os.umask(0o022)  # a common umask: files 0644 unless made otherwise
    try:
        db = Database(str(tmp_path / "calcx.db"))
        db.execute("CREATE TABLE t (x)")
        try:
            for name in ("calcx.db", "calcx.db-wal", "calcx.db-shm"):
                assert (tmp_path / name).stat().st_mode & 0o777 == 0o600, name
        finally:
            db.close()
        earlier = tmp_path / "earlier.db"
        earlier.touch(mode=0o644)
        Database(str(earlier)).close()
        assert earlier.stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old_umask)
