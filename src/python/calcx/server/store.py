"""Rollout store on SQLite: rollouts, attempts, events, recorded calls, the model registry.

One connection, WAL journal, `synchronous=NORMAL`: a committed transaction survives a crash of
the server process (only an OS crash or power loss can undo the last commits). Every method is
synchronous, short and runs on the event loop's thread; the loop therefore serialises them and
no transaction ever spans an `await`, which is what makes a claim atomic. (sqlite3's
`check_same_thread` guards against use from another thread.)
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from calcx.api.models import TERMINAL_STATES, RolloutCreate

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rollouts (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    rollout_id TEXT NOT NULL UNIQUE,
    group_id TEXT,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    latest_attempt INTEGER NOT NULL,
    reward REAL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS rollouts_by_state ON rollouts(state, seq);
CREATE INDEX IF NOT EXISTS rollouts_by_group ON rollouts(group_id, seq);
CREATE TABLE IF NOT EXISTS attempts (
    rollout_id TEXT NOT NULL,
    attempt_no INTEGER NOT NULL,
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    controller_id TEXT,
    reason TEXT,
    exit_code INTEGER,
    agent_seconds REAL,
    detail TEXT,
    lease_expires_at REAL,
    PRIMARY KEY (rollout_id, attempt_no)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS attempts_by_lease ON attempts(state, lease_expires_at);
CREATE INDEX IF NOT EXISTS attempts_by_controller ON attempts(controller_id, state);
CREATE TABLE IF NOT EXISTS events (
    event_id INTEGER PRIMARY KEY AUTOINCREMENT,
    rollout_id TEXT NOT NULL,
    attempt_no INTEGER NOT NULL,
    event_type TEXT NOT NULL,
    data TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_rollout ON events(rollout_id, event_id);
CREATE TABLE IF NOT EXISTS calls (
    call_id INTEGER PRIMARY KEY AUTOINCREMENT,
    rollout_id TEXT NOT NULL,
    attempt_no INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    request BLOB NOT NULL,
    response BLOB,
    prompt_token_ids BLOB NOT NULL,
    response_token_ids BLOB NOT NULL,
    response_logprobs BLOB NOT NULL,
    latency_s REAL NOT NULL,
    policy_version INTEGER,
    endpoint TEXT,
    status_code INTEGER NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS calls_by_rollout ON calls(rollout_id, attempt_no, seq);
CREATE TABLE IF NOT EXISTS terminal (
    cursor INTEGER PRIMARY KEY AUTOINCREMENT,
    rollout_id TEXT NOT NULL,
    attempt_no INTEGER NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""

_ATTEMPT_COLUMNS = (
    "attempt_no, state, created_at, started_at, finished_at, controller_id, reason, "
    "exit_code, agent_seconds, detail, lease_expires_at"
)


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


@dataclass(frozen=True)
class ExpiredAttempt:
    rollout_id: str
    attempt_id: str
    controller_id: str | None


def _pack(typecode: str, values: list) -> bytes:
    """Numbers packed little-endian ("i": int32 token ids, "d": float64 log-probs): far cheaper
    than JSON for long prompts."""
    packed = array(typecode, values)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def _unpack(typecode: str, blob: bytes) -> list:
    packed = array(typecode)
    packed.frombytes(blob)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tolist()


def _ids_blob(ids: list[int]) -> bytes:
    return _pack("i", ids)


def _ids_list(blob: bytes) -> list[int]:
    return _unpack("i", blob)


def _floats_blob(values: list[float]) -> bytes:
    return _pack("d", values)


def _floats_list(blob: bytes) -> list[float]:
    return _unpack("d", blob)


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def canonical_spec(spec: RolloutCreate) -> str:
    """The create body as stored and compared for idempotency (defaults filled, keys sorted)."""
    return json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _attempt_dict(row: Sequence[Any]) -> dict[str, Any]:
    return {
        "attempt_id": str(row[0]),
        "state": row[1],
        "created_at": row[2],
        "started_at": row[3],
        "finished_at": row[4],
        "controller_id": row[5],
        "reason": row[6],
        "exit_code": row[7],
        "agent_seconds": row[8],
        "detail": row[9],
        "lease_expires_at": row[10],
    }


def _parse_attempt_id(attempt_id: str) -> int | None:
    if not attempt_id.isdigit() or len(attempt_id) > 9:
        return None
    return int(attempt_id)


class RolloutStore:
    """Persistent rollout state; see the module docstring for the concurrency rule."""

    def __init__(self, path: str, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self._clock = clock
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=True)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=OFF")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.execute("PRAGMA cache_size=-32000")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    # ---- rollouts -------------------------------------------------------------------------

    def create_rollouts(self, specs: Sequence[RolloutCreate]) -> tuple[list[dict[str, Any]], int]:
        """Create a batch atomically; returns (rollouts in request order, number newly created).

        A rollout id that exists with the same body is returned as is; with another body the
        whole batch is refused (Conflict) and nothing is created.
        """
        now = self._clock()
        canon: dict[str, str] = {}
        order: list[str] = []
        for spec in specs:
            text = canonical_spec(spec)
            previous = canon.get(spec.rollout_id)
            if previous is None:
                canon[spec.rollout_id] = text
                order.append(spec.rollout_id)
            elif previous != text:
                raise Conflict(f"rollout {spec.rollout_id!r} appears twice in this batch with different bodies")
        created = 0
        with self._tx() as db:
            existing: dict[str, str] = {}
            ids = list(canon)
            for chunk_start in range(0, len(ids), 500):
                chunk = ids[chunk_start : chunk_start + 500]
                marks = ",".join("?" * len(chunk))
                for rid, spec_text in db.execute(
                    f"SELECT rollout_id, spec FROM rollouts WHERE rollout_id IN ({marks})", chunk
                ):
                    existing[rid] = spec_text
            clashes = [rid for rid, text in existing.items() if text != canon[rid]]
            if clashes:
                shown = ", ".join(repr(r) for r in clashes[:5])
                raise Conflict(
                    f"rollout id(s) {shown} already exist with a different body; use new ids "
                    "(creating is idempotent only for an identical body). Nothing was created."
                )
            new_rows = []
            new_attempts = []
            for rid in order:
                if rid in existing:
                    continue
                spec_obj = json.loads(canon[rid])
                new_rows.append((rid, spec_obj.get("group_id"), canon[rid], "QUEUED", 1, now))
                new_attempts.append((rid, 1, "QUEUED", now))
            if new_rows:
                db.executemany(
                    "INSERT INTO rollouts (rollout_id, group_id, spec, state, latest_attempt, created_at) "
                    "VALUES (?,?,?,?,?,?)",
                    new_rows,
                )
                db.executemany(
                    "INSERT INTO attempts (rollout_id, attempt_no, state, created_at) VALUES (?,?,?,?)",
                    new_attempts,
                )
                created = len(new_rows)
        by_id = {r["rollout_id"]: r for r in self.get_rollouts(order)}
        return [by_id[rid] for rid in order], created

    def get_rollout(self, rollout_id: str) -> dict[str, Any] | None:
        found = self.get_rollouts([rollout_id])
        return found[0] if found else None

    def get_rollouts(self, rollout_ids: Sequence[str]) -> list[dict[str, Any]]:
        """Full rollouts (attempts, events, reward) in the order given; unknown ids are skipped."""
        if not rollout_ids:
            return []
        db = self._db
        heads: dict[str, tuple[Any, ...]] = {}
        attempts: dict[str, list[dict[str, Any]]] = {}
        events: dict[str, list[dict[str, Any]]] = {}
        unique = list(dict.fromkeys(rollout_ids))
        for start in range(0, len(unique), 500):
            chunk = unique[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for row in db.execute(
                f"SELECT rollout_id, spec, state, reward, created_at FROM rollouts WHERE rollout_id IN ({marks})",
                chunk,
            ):
                heads[row[0]] = row
            for row in db.execute(
                f"SELECT rollout_id, {_ATTEMPT_COLUMNS} FROM attempts WHERE rollout_id IN ({marks}) "
                "ORDER BY rollout_id, attempt_no",
                chunk,
            ):
                attempts.setdefault(row[0], []).append(_attempt_dict(row[1:]))
            for row in db.execute(
                f"SELECT rollout_id, event_id, attempt_no, event_type, data, created_at FROM events "
                f"WHERE rollout_id IN ({marks}) ORDER BY event_id",
                chunk,
            ):
                events.setdefault(row[0], []).append(
                    {
                        "event_id": row[1],
                        "attempt_id": str(row[2]),
                        "event_type": row[3],
                        "data": json.loads(row[4]),
                        "created_at": row[5],
                    }
                )
        out = []
        for rid in rollout_ids:
            head = heads.get(rid)
            if head is None:
                continue
            rollout = json.loads(head[1])
            rollout["state"] = head[2]
            rollout["attempts"] = attempts.get(rid, [])
            rollout["reward"] = head[3]
            rollout["events"] = events.get(rid, [])
            rollout["created_at"] = head[4]
            out.append(rollout)
        return out

    def list_rollouts(
        self,
        state: str | None = None,
        group_id: str | None = None,
        controller_id: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[dict[str, Any]]:
        """Rollouts in creation order, filtered by state, group and/or current controller."""
        where = []
        args: list[Any] = []
        if state is not None:
            where.append("r.state = ?")
            args.append(state)
        if group_id is not None:
            where.append("r.group_id = ?")
            args.append(group_id)
        join = ""
        if controller_id is not None:
            join = " JOIN attempts a ON a.rollout_id = r.rollout_id AND a.attempt_no = r.latest_attempt"
            where.append("a.controller_id = ?")
            args.append(controller_id)
        sql = f"SELECT r.rollout_id FROM rollouts r{join}"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY r.seq LIMIT ? OFFSET ?"
        args += [limit, offset]
        ids = [row[0] for row in self._db.execute(sql, args)]
        return self.get_rollouts(ids)

    def count_by_state(self) -> dict[str, int]:
        return dict(self._db.execute("SELECT state, COUNT(*) FROM rollouts GROUP BY state").fetchall())

    # ---- attempts -------------------------------------------------------------------------

    def rollout_policy_version(self, rollout_id: str) -> int | None:
        """The policy version the rollout was created for (None when the trainer gave none)."""
        row = self._db.execute("SELECT spec FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone()
        if row is None:
            return None
        version = json.loads(row[0]).get("policy_version")
        return int(version) if isinstance(version, int) else None

    def attempt_state(self, rollout_id: str, attempt_id: str) -> str:
        """The state of one attempt; NotFound names what is missing."""
        attempt_no = _parse_attempt_id(attempt_id)
        row = None
        if attempt_no is not None:
            row = self._db.execute(
                "SELECT state FROM attempts WHERE rollout_id = ? AND attempt_no = ?", (rollout_id, attempt_no)
            ).fetchone()
        if row is None:
            if self._db.execute("SELECT 1 FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone() is None:
                raise NotFound(f"no rollout {rollout_id!r}")
            raise NotFound(f"rollout {rollout_id!r} has no attempt {attempt_id!r}")
        return row[0]

    def claim(self, controller_id: str, max_count: int, lease_s: float) -> list[tuple[str, str]]:
        """Move up to `max_count` QUEUED rollouts (oldest first) to RUNNING for `controller_id`."""
        now = self._clock()
        with self._tx() as db:
            picked = db.execute(
                "SELECT rollout_id, latest_attempt FROM rollouts WHERE state = 'QUEUED' ORDER BY seq LIMIT ?",
                (max_count,),
            ).fetchall()
            if not picked:
                return []
            db.executemany(
                "UPDATE attempts SET state = 'RUNNING', started_at = ?, controller_id = ?, lease_expires_at = ? "
                "WHERE rollout_id = ? AND attempt_no = ?",
                [(now, controller_id, now + lease_s, rid, no) for rid, no in picked],
            )
            db.executemany(
                "UPDATE rollouts SET state = 'RUNNING' WHERE rollout_id = ?", [(rid,) for rid, _ in picked]
            )
        return [(rid, str(no)) for rid, no in picked]

    def unclaim(self, controller_id: str, picked: Sequence[tuple[str, str]]) -> int:
        """Put claimed attempts back to QUEUED (their claimer went away before the answer)."""
        count = 0
        with self._tx() as db:
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
    ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """Extend the leases a controller holds; returns (held, lost).

        With `refs` None every RUNNING attempt of the controller is extended. Otherwise only the
        listed ones, and those that are no longer RUNNING under this controller come back as lost.
        """
        now = self._clock()
        expires = now + lease_s
        with self._tx() as db:
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
            held, lost = [], []
            for rid, aid in refs:
                no = _parse_attempt_id(aid)
                cur = None
                if no is not None:
                    cur = db.execute(
                        "UPDATE attempts SET lease_expires_at = ? WHERE rollout_id = ? AND attempt_no = ? "
                        "AND controller_id = ? AND state = 'RUNNING'",
                        (expires, rid, no, controller_id),
                    )
                (held if cur is not None and cur.rowcount == 1 else lost).append((rid, aid))
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
        current = self.attempt_state(rollout_id, attempt_id)
        if current != "RUNNING":
            raise Conflict(
                f"attempt {attempt_id} of rollout {rollout_id!r} is {current}, not RUNNING; only a running "
                "attempt can be finished"
            )
        now = self._clock()
        no = int(attempt_id)
        with self._tx() as db:
            return self._finish_locked(db, rollout_id, no, state, reason, exit_code, agent_seconds, detail, now)

    def _finish_locked(
        self,
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

    def retry(self, rollout_id: str) -> str:
        """Queue a new attempt after a FAILED one; returns the new attempt id."""
        row = self._db.execute(
            "SELECT state, latest_attempt, spec FROM rollouts WHERE rollout_id = ?", (rollout_id,)
        ).fetchone()
        if row is None:
            raise NotFound(f"no rollout {rollout_id!r}")
        state, latest, spec = row
        max_attempts = json.loads(spec)["max_attempts"]
        if state != "FAILED":
            raise Conflict(f"rollout {rollout_id!r} is {state}; only a FAILED rollout can be retried")
        if latest >= max_attempts:
            raise Conflict(
                f"rollout {rollout_id!r} already used {latest} of max_attempts={max_attempts} attempts"
            )
        now = self._clock()
        with self._tx() as db:
            db.execute(
                "INSERT INTO attempts (rollout_id, attempt_no, state, created_at) VALUES (?,?,?,?)",
                (rollout_id, latest + 1, "QUEUED", now),
            )
            db.execute(
                "UPDATE rollouts SET state = 'QUEUED', latest_attempt = ?, reward = NULL WHERE rollout_id = ?",
                (latest + 1, rollout_id),
            )
        return str(latest + 1)

    def expire_leases(self) -> list[ExpiredAttempt]:
        """FAIL (reason controller_lost) every RUNNING attempt whose lease has passed."""
        now = self._clock()
        rows = self._db.execute(
            "SELECT rollout_id, attempt_no, controller_id, lease_expires_at FROM attempts "
            "WHERE state = 'RUNNING' AND lease_expires_at < ?",
            (now,),
        ).fetchall()
        if not rows:
            return []
        with self._tx() as db:
            for rid, no, controller, expired_at in rows:
                detail = (
                    f"controller {controller!r} sent no heartbeat for this attempt; its lease expired at "
                    f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(expired_at))}"
                )
                self._finish_locked(db, rid, no, "FAILED", "controller_lost", None, None, detail, now)
        return [ExpiredAttempt(rid, str(no), controller) for rid, no, controller, _ in rows]

    def renew_running_leases(self, lease_s: float) -> int:
        """At startup: give every RUNNING attempt a fresh lease so live controllers can heartbeat."""
        now = self._clock()
        with self._tx() as db:
            cur = db.execute(
                "UPDATE attempts SET lease_expires_at = MAX(COALESCE(lease_expires_at, 0), ?) WHERE state = 'RUNNING'",
                (now + lease_s,),
            )
            return cur.rowcount

    # ---- events and calls -----------------------------------------------------------------

    def add_event(
        self, rollout_id: str, attempt_id: str, event_type: str, data: dict[str, Any], reward: float | None
    ) -> int:
        """Store an event on a RUNNING attempt; a reward also becomes the rollout's reward."""
        current = self.attempt_state(rollout_id, attempt_id)
        if current != "RUNNING":
            raise Conflict(
                f"attempt {attempt_id} of rollout {rollout_id!r} is {current}; events are accepted only "
                "while the attempt is RUNNING"
            )
        now = self._clock()
        no = int(attempt_id)
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO events (rollout_id, attempt_no, event_type, data, created_at) VALUES (?,?,?,?,?)",
                (rollout_id, no, event_type, _dumps(data), now),
            )
            if reward is not None:
                db.execute(
                    "UPDATE rollouts SET reward = ? WHERE rollout_id = ? AND latest_attempt = ?",
                    (reward, rollout_id, no),
                )
        return int(cur.lastrowid or 0)

    def record_call(
        self,
        rollout_id: str,
        attempt_id: str,
        request_json: bytes,
        response_json: bytes | None,
        prompt_token_ids: list[int],
        response_token_ids: list[int],
        response_logprobs: list[float],
        latency_s: float,
        policy_version: int | None,
        endpoint: str | None,
        status_code: int,
    ) -> int:
        """Store one gateway call; request and response are the JSON bytes as sent and received."""
        now = self._clock()
        no = int(attempt_id)
        with self._tx() as db:
            seq_row = db.execute(
                "SELECT COALESCE(MAX(seq) + 1, 0) FROM calls WHERE rollout_id = ? AND attempt_no = ?",
                (rollout_id, no),
            ).fetchone()
            cur = db.execute(
                "INSERT INTO calls (rollout_id, attempt_no, seq, request, response, prompt_token_ids, "
                "response_token_ids, response_logprobs, latency_s, policy_version, endpoint, status_code, "
                "created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    rollout_id,
                    no,
                    seq_row[0],
                    request_json,
                    response_json,
                    _ids_blob(prompt_token_ids),
                    _ids_blob(response_token_ids),
                    _floats_blob(response_logprobs),
                    latency_s,
                    policy_version,
                    endpoint,
                    status_code,
                    now,
                ),
            )
        return int(cur.lastrowid or 0)

    def list_calls(self, rollout_id: str, attempt_id: str | None = None) -> list[dict[str, Any]]:
        if self._db.execute("SELECT 1 FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone() is None:
            raise NotFound(f"no rollout {rollout_id!r}")
        sql = (
            "SELECT call_id, attempt_no, seq, request, response, prompt_token_ids, response_token_ids, "
            "response_logprobs, latency_s, policy_version, endpoint, status_code, created_at FROM calls "
            "WHERE rollout_id = ?"
        )
        args: list[Any] = [rollout_id]
        if attempt_id is not None:
            no = _parse_attempt_id(attempt_id)
            if no is None:
                raise NotFound(f"rollout {rollout_id!r} has no attempt {attempt_id!r}")
            sql += " AND attempt_no = ?"
            args.append(no)
        sql += " ORDER BY attempt_no, seq"
        return [
            {
                "call_id": r[0],
                "rollout_id": rollout_id,
                "attempt_id": str(r[1]),
                "seq": r[2],
                "request": json.loads(r[3]),
                "response": None if r[4] is None else json.loads(r[4]),
                "prompt_token_ids": _ids_list(r[5]),
                "response_token_ids": _ids_list(r[6]),
                "response_logprobs": _floats_list(r[7]),
                "latency_s": r[8],
                "policy_version": r[9],
                "endpoint": r[10],
                "status_code": r[11],
                "created_at": r[12],
            }
            for r in self._db.execute(sql, args)
        ]

    # ---- terminal cursor ------------------------------------------------------------------

    def terminal_after(self, cursor: int, limit: int) -> list[tuple[int, str, str]]:
        """(cursor, rollout id, attempt id) of attempts that became terminal after `cursor`."""
        return [
            (c, rid, str(no))
            for c, rid, no in self._db.execute(
                "SELECT cursor, rollout_id, attempt_no FROM terminal WHERE cursor > ? ORDER BY cursor LIMIT ?",
                (cursor, limit),
            )
        ]

    # ---- model registry -------------------------------------------------------------------

    def get_kv(self, key: str) -> Any | None:
        row = self._db.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def put_kv(self, key: str, value: Any) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO kv (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, _dumps(value)),
            )


def is_terminal(state: str) -> bool:
    return state in TERMINAL_STATES
