"""Rollouts: idempotent batch creation and reads of whole rollouts (attempts, events, reward)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from calcx.api.models import RolloutCreate
from calcx.server.store.database import Conflict, Database

_ATTEMPT_COLUMNS = (
    "attempt_no, state, created_at, started_at, finished_at, controller_id, reason, "
    "exit_code, agent_seconds, detail, lease_expires_at, token_nonce"
)
_CHUNK = 500  # ids per `IN (...)`, well under SQLite's limit on bound variables


def canonical_spec(spec: RolloutCreate) -> str:
    """The create body as stored and compared for idempotency (defaults filled, keys sorted).

    `sampling` is left out when absent: rollouts stored before the field existed have no such
    key, and an identical body sent again to the upgraded server must still match them.
    """
    body = spec.model_dump(mode="json")
    if body.get("sampling") is None:
        body.pop("sampling", None)
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _attempt_dict(row: Sequence[Any], wall_time: Callable[[float], float]) -> dict[str, Any]:
    """One attempt as the API shows it; the lease deadline (monotonic, in the table) as wall time."""
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
        "lease_expires_at": None if row[10] is None else wall_time(row[10]),
        "token_nonce": row[11],
    }


class Rollouts:
    def __init__(self, db: Database) -> None:
        self._db = db

    def create(self, specs: Sequence[RolloutCreate]) -> tuple[list[dict[str, Any]], int]:
        """Create a batch atomically; returns (rollouts in request order, number newly created).

        A rollout id that exists with the same body is returned as is; with another body the
        whole batch is refused (Conflict) and nothing is created.
        """
        now = self._db.clock()
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
        with self._db.tx() as db:
            existing: dict[str, str] = {}
            ids = list(canon)
            for chunk_start in range(0, len(ids), _CHUNK):
                chunk = ids[chunk_start : chunk_start + _CHUNK]
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
        by_id = {r["rollout_id"]: r for r in self.get_many(order)}
        return [by_id[rid] for rid in order], created

    def get(self, rollout_id: str) -> dict[str, Any] | None:
        found = self.get_many([rollout_id])
        return found[0] if found else None

    def get_many(self, rollout_ids: Sequence[str]) -> list[dict[str, Any]]:
        """Full rollouts (attempts, events, reward) in the order given; unknown ids are skipped."""
        if not rollout_ids:
            return []
        db = self._db
        heads: dict[str, tuple[Any, ...]] = {}
        attempts: dict[str, list[dict[str, Any]]] = {}
        events: dict[str, list[dict[str, Any]]] = {}
        unique = list(dict.fromkeys(rollout_ids))
        for start in range(0, len(unique), _CHUNK):
            chunk = unique[start : start + _CHUNK]
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
                attempts.setdefault(row[0], []).append(_attempt_dict(row[1:], self._db.wall_time))
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

    def query(
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
        return self.get_many(ids)

    def count_by_state(self) -> dict[str, int]:
        return dict(self._db.execute("SELECT state, COUNT(*) FROM rollouts GROUP BY state").fetchall())

    def sampling(self, rollout_id: str) -> dict[str, Any]:
        """The sampling parameters the gateway applies to the rollout's calls ({} when it has none)."""
        row = self._db.execute("SELECT spec FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone()
        if row is None:
            return {}
        sampling = json.loads(row[0]).get("sampling")
        return sampling if isinstance(sampling, dict) else {}
