"""`/healthz` answers 200 only while the store takes a write: a store that cannot write (here
another connection holding SQLite's write lock, as another process on the file would) is a 503
that says why, and the server is healthy again once it can."""

from __future__ import annotations

import sqlite3

import httpx

from calcx.server.serve import ServerThread


def test_healthz_probes_that_the_store_can_write(server: ServerThread, db_path: str) -> None:
    ok = httpx.get(f"{server.url}/healthz", timeout=10)
    assert ok.status_code == 200 and ok.json()["status"] == "ok" and ok.json()["store"] == "writable"

    other = sqlite3.connect(db_path, isolation_level=None, timeout=0)
    try:
        other.execute("BEGIN IMMEDIATE")  # holds the write lock; readers still read
        locked = httpx.get(f"{server.url}/healthz", timeout=10)
        assert locked.status_code == 503, locked.text
        body = locked.json()
        assert body["status"] == "unavailable" and "cannot write" in body["store"] and "locked" in body["store"]
    finally:
        other.execute("ROLLBACK")
        other.close()

    again = httpx.get(f"{server.url}/healthz", timeout=10)
    assert again.status_code == 200 and again.json()["store"] == "writable"
