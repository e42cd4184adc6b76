"""A store file opened read-only: what a finished run's tables (`calcx runs table`) read from a
copy of its SQLite store (or a live one: nothing is written, so the server is undisturbed).

`Database` opens the file to serve it (WAL, schema, writes); this opens it as SQLite's `mode=ro`
URI and only reads. Each method is one query, answering in the table's own order (rowid), so the
figures made from it are the same from run to run.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

class StoreReader:
    """Read-only queries over one store file; use as a context manager or `close()` it."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no store file {self.path}")
        self._conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True)

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._conn.close()

    def rollout_times(self) -> Iterator[tuple[str, float]]:
        """(rollout_id, created_at) of every rollout."""
        for rid, at in self._conn.execute("SELECT rollout_id, created_at FROM rollouts"):
            yield str(rid), float(at)

    def rollout_specs(self) -> Iterator[tuple[str, str, Any]]:
        """(spec JSON text, state, reward) of every rollout: the create body as stored."""
        for spec, state, reward in self._conn.execute("SELECT spec, state, reward FROM rollouts"):
            yield spec, state, reward

    def first_trained_created(self) -> dict[int, float]:
        """Per step of the training ledger, the creation time of the earliest rollout it trained,
        over the records no resume rolled back."""
        return {int(step): float(at) for step, at in self._conn.execute(
            "SELECT t.step, MIN(r.created_at) FROM trained t JOIN rollouts r ON r.rollout_id = t.rollout_id "
            "WHERE t.rolled_back_at IS NULL GROUP BY t.step")}

    def attempt_states(self) -> Iterator[tuple[str, str]]:
        """(rollout_id, state) of every attempt."""
        for rid, state in self._conn.execute("SELECT rollout_id, state FROM attempts"):
            yield str(rid), state

    def last_finished(self) -> dict[str, float]:
        """Each rollout's latest attempt finish time (rollouts none of whose attempts finished are absent)."""
        return {str(rid): float(at) for rid, at in self._conn.execute(
            "SELECT rollout_id, MAX(finished_at) FROM attempts WHERE finished_at IS NOT NULL GROUP BY rollout_id")}

    def answered_call_times(self) -> Iterator[tuple[str, float, float]]:
        """(rollout_id, created_at, latency_s) of every call answered with HTTP 200; created_at is
        when the answer was recorded."""
        for created, latency, rid in self._conn.execute(
                "SELECT created_at, latency_s, rollout_id FROM calls WHERE status_code = 200"):
            yield str(rid), float(created), float(latency)

    def answered_calls(self) -> Iterator[tuple[str, int, int, bytes, bytes | None, int | None]]:
        """(rollout_id, attempt_no, seq, request, response, policy_version) of every call answered
        with HTTP 200; request and response are the JSON bytes the gateway recorded."""
        for rid, attempt_no, seq, request, response, version in self._conn.execute(
                "SELECT rollout_id, attempt_no, seq, request, response, policy_version FROM calls "
                "WHERE status_code = 200"):
            yield str(rid), int(attempt_no), int(seq), request, response, version

    def call_outcomes(self, rollout_id: str) -> list[tuple[int, bytes | None, bool]]:
        """(status_code, response, whether any response token came) of each call of one rollout."""
        return [(int(status), response, bool(size)) for status, response, size in self._conn.execute(
            "SELECT status_code, response, LENGTH(response_token_ids) FROM calls WHERE rollout_id = ?", (rollout_id,))]
