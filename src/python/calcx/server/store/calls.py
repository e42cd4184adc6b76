"""Recorded gateway calls: the request and answer as JSON bytes, token ids and log-probs packed."""

from __future__ import annotations

import json
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from calcx.server.store.database import Database, NotFound, parse_attempt_id


def _pack(typecode: str, values: Sequence[int] | Sequence[float]) -> bytes:
    """Numbers packed little-endian ("i": int32 token ids, "d": float64 log-probs): far cheaper
    than JSON for long prompts."""
    packed = array(typecode, values)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def unpack_numbers(typecode: str, blob: bytes) -> list:
    """What `_pack` packed (the read-only reader unpacks the store's rows with it too)."""
    packed = array(typecode)
    packed.frombytes(blob)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tolist()


@dataclass(frozen=True)
class CallRecord:
    """One model call as the gateway records it: what `Calls.record` stores, in one value.

    `request` and `response` are the JSON bytes as forwarded and as received (`response` is None
    when the upstream's answer was not JSON). `abandoned`: the agent hung up before the answer
    came (status 499); such a record never replaces another."""

    rollout_id: str
    attempt_id: str
    request: bytes
    response: bytes | None
    status_code: int
    latency_s: float
    policy_version: int | None
    endpoint: str | None
    prompt_token_ids: Sequence[int] = ()
    response_token_ids: Sequence[int] = ()
    response_logprobs: Sequence[float] = ()
    abandoned: bool = False

    def without_tokens(self) -> CallRecord:
        """The same call without token ids and log-probs (for ids the store cannot pack)."""
        return replace(self, prompt_token_ids=(), response_token_ids=(), response_logprobs=())


class Calls:
    def __init__(self, db: Database) -> None:
        self._db = db

    def record(self, call: CallRecord) -> int:
        """Store one gateway call and return its `call_id`. TypeError or OverflowError when its
        token ids are not int32 integers (nothing is stored then).

        A call whose request is byte for byte one this attempt already made is the agent's client
        sending it again (its retry after a timeout or an error answer): it replaces that record,
        keeping its place (`seq`) and id, so a resent call is recorded, and trained, once, with the
        answer the agent went on with. An `abandoned` answer (its caller hung up before it came,
        and resends it) is kept only when nothing else of that request is, and never replaces."""
        now = self._db.clock()
        rollout_id, request_json, no = call.rollout_id, call.request, int(call.attempt_id)
        answer = (
            call.response,
            _pack("i", call.prompt_token_ids),
            _pack("i", call.response_token_ids),
            _pack("d", call.response_logprobs),
            call.latency_s,
            call.policy_version,
            call.endpoint,
            call.status_code,
            now,
        )
        with self._db.tx() as db:
            earlier = db.execute(
                "SELECT call_id FROM calls WHERE rollout_id = ? AND attempt_no = ? AND request = ? "
                "ORDER BY seq DESC LIMIT 1",
                (rollout_id, no, request_json),
            ).fetchone()
            if earlier is not None and call.abandoned:
                return int(earlier[0])
            if earlier is not None:
                db.execute(
                    "UPDATE calls SET response = ?, prompt_token_ids = ?, response_token_ids = ?, "
                    "response_logprobs = ?, latency_s = ?, policy_version = ?, endpoint = ?, status_code = ?, "
                    "created_at = ? WHERE call_id = ?",
                    (*answer, earlier[0]),
                )
                return int(earlier[0])
            seq_row = db.execute(
                "SELECT COALESCE(MAX(seq) + 1, 0) FROM calls WHERE rollout_id = ? AND attempt_no = ?",
                (rollout_id, no),
            ).fetchone()
            cur = db.execute(
                "INSERT INTO calls (rollout_id, attempt_no, seq, request, response, prompt_token_ids, "
                "response_token_ids, response_logprobs, latency_s, policy_version, endpoint, status_code, "
                "created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (rollout_id, no, seq_row[0], request_json, *answer),
            )
        return int(cur.lastrowid or 0)

    def usage(self, rollout_id: str, attempt_id: str) -> tuple[int, int]:
        """(calls recorded, bytes of their requests and answers) of one attempt: what its caps count
        (calcx.server.budget adds the calls reserved and not yet recorded)."""
        no = parse_attempt_id(attempt_id)
        if no is None:
            return 0, 0
        count, size = self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(request) + COALESCE(LENGTH(response), 0)), 0) FROM calls "
            "WHERE rollout_id = ? AND attempt_no = ?",
            (rollout_id, no),
        ).fetchone()
        return int(count), int(size)

    def query(self, rollout_id: str, attempt_id: str | None = None) -> list[dict[str, Any]]:
        """A rollout's calls (or one attempt's), ordered by attempt, then `seq`."""
        self._db.require_rollout(rollout_id)
        sql = (
            "SELECT call_id, attempt_no, seq, request, response, prompt_token_ids, response_token_ids, "
            "response_logprobs, latency_s, policy_version, endpoint, status_code, created_at FROM calls "
            "WHERE rollout_id = ?"
        )
        args: list[Any] = [rollout_id]
        if attempt_id is not None:
            no = parse_attempt_id(attempt_id)
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
                "prompt_token_ids": unpack_numbers("i", r[5]),
                "response_token_ids": unpack_numbers("i", r[6]),
                "response_logprobs": unpack_numbers("d", r[7]),
                "latency_s": r[8],
                "policy_version": r[9],
                "endpoint": r[10],
                "status_code": r[11],
                "created_at": r[12],
            }
            for r in self._db.execute(sql, args)
        ]
