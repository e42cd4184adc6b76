"""Stores for the tests of `calcx runs`: the server's own schema, with the rows a test needs."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from calcx.server.store.schema import SCHEMA


def new_store(path: Path) -> sqlite3.Connection:
    """An empty store at `path` (every table), open for the test's inserts."""
    con = sqlite3.connect(path)
    con.executescript(SCHEMA)
    return con


def val_store(path: Path, outcomes: dict[int, dict[str, str]]) -> Path:
    """A store whose validation rollouts scored `outcomes` ({step: {row: "right,wrong,failed,..."}},
    one result a session; rows ending in -hard are of the source gsm8k-hard), beside rollouts that
    are not validation problems."""
    con = new_store(path)

    def insert(rid: str, row: dict, labels: dict, state: str, reward: float | None) -> None:
        con.execute(
            "insert into rollouts (rollout_id, spec, state, latest_attempt, reward, created_at) "
            "values (?, ?, ?, 1, ?, 0)",
            (rid, json.dumps({"row": row, "labels": labels}), state, reward),
        )

    for step, rows in outcomes.items():
        for row, results in rows.items():
            source = "gsm8k-hard" if row.endswith("-hard") else "gsm8k"
            for session, result in enumerate(results.split(",")):
                # a failed rollout keeps whatever reward it last posted: still not scored
                state, reward = ("FAILED", 1.0) if result == "failed" else ("SUCCEEDED", float(result == "right"))
                insert(
                    f"calcx-val-s{step}-{row}-{session}",
                    {"id": row, "question": "q", "source": source},
                    {"partition": "val", "run": "r", "step": str(step)},
                    state,
                    reward,
                )
    insert("calcx-train-s1-a", {"id": "a", "question": "q"}, {"partition": "train", "step": "1"}, "SUCCEEDED", 0.0)
    insert("calcx-val-s10-noid", {"question": "q"}, {"partition": "val", "step": "10"}, "SUCCEEDED", 1.0)
    # int() would read these as 7 and fail on the second
    insert("calcx-val-sx-a", {"id": "a"}, {"partition": "val", "step": "\u0667"}, "SUCCEEDED", 1.0)
    insert("calcx-val-sy-a", {"id": "a"}, {"partition": "val", "step": "\u00b2"}, "SUCCEEDED", 1.0)
    con.commit()
    con.close()
    return path


def insert_rollout(
    con: sqlite3.Connection,
    rollout_id: str,
    row: dict,
    labels: dict,
    state: str,
    reward: float | None,
    latest_attempt: int = 1,
) -> None:
    """One rollout as the server stores it: its create body (row, labels), state and reward."""
    con.execute(
        "insert into rollouts (rollout_id, spec, state, latest_attempt, reward, created_at) values (?, ?, ?, ?, ?, 0)",
        (rollout_id, json.dumps({"row": row, "labels": labels}), state, latest_attempt, reward),
    )


def insert_call(
    con: sqlite3.Connection,
    rollout_id: str,
    attempt_no: int,
    seq: int,
    request: dict,
    response: dict | None,
    status_code: int = 200,
) -> None:
    """One recorded model call: the request the agent sent and the response it got (no token ids)."""
    con.execute(
        "insert into calls (rollout_id, attempt_no, seq, request, response, prompt_token_ids, response_token_ids, "
        "response_logprobs, latency_s, status_code, created_at) values (?, ?, ?, ?, ?, x'', x'', x'', 0.1, ?, 0)",
        (
            rollout_id,
            attempt_no,
            seq,
            json.dumps(request).encode(),
            None if response is None else json.dumps(response).encode(),
            status_code,
        ),
    )
