"""A store file opened read-only: what a finished run's tables (`calcx runs table`) read from a
copy of its SQLite store (or a live one: nothing is written, so the server is undisturbed).

`Database` opens the file to serve it (WAL, schema, writes); this opens it as SQLite's `mode=ro`
URI and only reads. Each method is one query, answering in the table's own order (rowid), so the
figures made from it are the same from run to run.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from calcx.api.models import RecordedCall
from calcx.server.store.calls import unpack_numbers


def _json_object(raw: str | bytes | None) -> dict[str, Any] | None:
    """A recorded request or response as its JSON object; None for one that is not JSON or not an object."""
    try:
        value = json.loads(raw) if raw is not None else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


_CALL_COLUMNS = (
    "call_id, rollout_id, attempt_no, seq, request, response, prompt_token_ids, response_token_ids, "
    "response_logprobs, latency_s, policy_version, endpoint, status_code, created_at"
)


def _recorded(row: tuple[Any, ...]) -> RecordedCall:
    """One `calls` row (the columns of _CALL_COLUMNS) as the API's `RecordedCall`."""
    return RecordedCall(
        call_id=row[0],
        rollout_id=str(row[1]),
        attempt_id=str(row[2]),
        seq=row[3],
        request=_json_object(row[4]) or {},
        response=_json_object(row[5]),
        prompt_token_ids=unpack_numbers("i", row[6]),
        response_token_ids=unpack_numbers("i", row[7]),
        response_logprobs=unpack_numbers("d", row[8]),
        latency_s=row[9],
        policy_version=row[10],
        endpoint=row[11],
        status_code=row[12],
        created_at=row[13],
    )


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
        yield from self._conn.execute("SELECT spec, state, reward FROM rollouts")

    def rollout_rows(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(rollout_id, the dataset row of its create body; {} when it has none) of every rollout."""
        for rid, spec_text in self._conn.execute("SELECT rollout_id, spec FROM rollouts"):
            row = (_json_object(spec_text) or {}).get("row")
            yield str(rid), row if isinstance(row, dict) else {}

    def first_trained_created(self) -> dict[int, float]:
        """Per step of the training ledger, the creation time of the earliest rollout it trained,
        over the records no resume rolled back."""
        return {
            int(step): float(at)
            for step, at in self._conn.execute(
                "SELECT t.step, MIN(r.created_at) FROM trained t JOIN rollouts r ON r.rollout_id = t.rollout_id "
                "WHERE t.rolled_back_at IS NULL GROUP BY t.step"
            )
        }

    def attempt_states(self) -> Iterator[tuple[str, str]]:
        """(rollout_id, state) of every attempt."""
        for rid, state in self._conn.execute("SELECT rollout_id, state FROM attempts"):
            yield str(rid), state

    def last_finished(self) -> dict[str, float]:
        """Each rollout's latest attempt finish time (rollouts none of whose attempts finished are absent)."""
        return {
            str(rid): float(at)
            for rid, at in self._conn.execute(
                "SELECT rollout_id, MAX(finished_at) FROM attempts WHERE finished_at IS NOT NULL GROUP BY rollout_id"
            )
        }

    def answered_call_times(self) -> Iterator[tuple[str, float, float]]:
        """(rollout_id, created_at, latency_s) of every call answered with HTTP 200; created_at is
        when the answer was recorded."""
        for created, latency, rid in self._conn.execute(
            "SELECT created_at, latency_s, rollout_id FROM calls WHERE status_code = 200"
        ):
            yield str(rid), float(created), float(latency)

    def answered_calls(self) -> Iterator[RecordedCall]:
        """Every call answered with HTTP 200, as the API's `RecordedCall` (what the trainer reads
        from the server): a request that is not a JSON object reads as {}, such a response as None."""
        for row in self._conn.execute(f"SELECT {_CALL_COLUMNS} FROM calls WHERE status_code = 200"):
            yield _recorded(row)

    def attempt_calls(self, rollout_id: str, attempt_no: int) -> list[RecordedCall]:
        """The calls of one attempt answered with HTTP 200, in the agent's order (seq), read as
        `answered_calls` reads them: one attempt's calls at a time, not the whole table."""
        return [
            _recorded(row)
            for row in self._conn.execute(
                f"SELECT {_CALL_COLUMNS} FROM calls WHERE rollout_id = ? AND attempt_no = ? AND status_code = 200 "
                "ORDER BY seq, call_id",
                (rollout_id, attempt_no),
            )
        ]

    def rollout_records(self) -> Iterator[tuple[str, dict[str, Any], str, Any, int]]:
        """(rollout_id, its create body as an object, state, reward, latest attempt number) of every
        rollout, in the order they were created; a body that is not a JSON object reads as {}."""
        for rid, spec_text, state, reward, latest in self._conn.execute(
            "SELECT rollout_id, spec, state, reward, latest_attempt FROM rollouts ORDER BY seq"
        ):
            yield str(rid), _json_object(spec_text) or {}, str(state), reward, int(latest)

    def call_outcomes(self, rollout_id: str) -> list[tuple[int, bytes | None, bool]]:
        """(status_code, response, whether any response token came) of each call of one rollout."""
        return [
            (int(status), response, bool(size))
            for status, response, size in self._conn.execute(
                "SELECT status_code, response, LENGTH(response_token_ids) FROM calls WHERE rollout_id = ?",
                (rollout_id,),
            )
        ]
