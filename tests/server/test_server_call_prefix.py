"""benchmarks/call_prefix.py on a store with the server's own schema: which consecutive model calls
of a rollout continue the previous call's tokens, and the tokens a rollout trains as one sample a
call against as one sequence (only the latest attempt's calls answered 200 count)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from benchmarks.call_prefix import main, measure
from calcx.contract.labels import PARTITION_LABEL, RUN_LABEL, STEP_LABEL
from calcx.server.store.schema import SCHEMA


def _store(
    path: Path,
    rollouts: dict[str, tuple[str, int, list[tuple[int, int, list[int], list[int]]]]],
    running: frozenset[str] = frozenset(),
) -> str:
    """rollouts: id -> (partition, latest attempt, [(attempt, status, prompt ids, generated ids)]);
    the ids in `running` are still RUNNING, the others SUCCEEDED."""
    con = sqlite3.connect(path)
    con.executescript(SCHEMA)
    for rid, (partition, latest, calls) in rollouts.items():
        spec = {"rollout_id": rid, "labels": {PARTITION_LABEL: partition, RUN_LABEL: "r", STEP_LABEL: "1"}}
        con.execute(
            "INSERT INTO rollouts (rollout_id, group_id, spec, state, latest_attempt, reward, created_at)"
            " VALUES (?, 'g', ?, ?, ?, 1.0, 0)",
            (rid, json.dumps(spec), "RUNNING" if rid in running else "SUCCEEDED", latest),
        )
        for seq, (attempt, status, prompt, generated) in enumerate(calls):
            answer = {"prompt_token_ids": prompt, "choices": [{"index": 0, "token_ids": generated}]}
            con.execute(
                "INSERT INTO calls (rollout_id, attempt_no, seq, request, response, prompt_token_ids,"
                " response_token_ids, response_logprobs, latency_s, status_code, created_at)"
                " VALUES (?, ?, ?, '{}', ?, x'', x'', x'', 0.1, ?, 0)",
                (rid, attempt, seq, json.dumps(answer) if status == 200 else None, status),
            )
    con.commit()
    con.close()
    return str(path)


def test_prefix_pairs_and_the_tokens_of_one_sequence(tmp_path: Path, capsys) -> None:
    db = _store(
        tmp_path / "calcx.db",
        {
            # three calls, each prompt the previous prompt + answer + a tool result: one sequence of 9 tokens
            "a": (
                "train",
                1,
                [(1, 200, [1, 2], [3]), (1, 200, [1, 2, 3, 4], [5]), (1, 200, [1, 2, 3, 4, 5, 6], [7, 8, 9])],
            ),
            # the answer rendered again differently (33 for 3): not a prefix; an earlier attempt and a 500 left out
            "b": (
                "train",
                2,
                [(1, 200, [9], [9]), (2, 200, [1, 2], [3]), (2, 500, [], []), (2, 200, [1, 2, 33, 4], [5])],
            ),
            "v": ("val", 1, [(1, 200, [1], [2])]),
            # still running (its calls so far are not what the trainer trains): left out
            "r": ("train", 1, [(1, 200, [1, 2], [3]), (1, 200, [7], [8])]),
        },
        running=frozenset({"r"}),
    )
    report = measure(db)
    assert report["calls_left_out"] == 1  # the 500 (the earlier attempt's call is not counted at all)
    train = report["partitions"]["train"]
    assert (train["rollouts"], train["call_pairs"], train["prefix_pairs"]) == (2, 3, 2)
    # a: 3 + 5 + 9 = 17 as samples, 9 as one sequence; b: 3 + 5 = 8, 5
    assert (train["tokens_per_rollout_as_call_samples"], train["tokens_per_rollout_as_one_sequence"]) == (12, 7)
    assert train["ratio"] == round(25 / 14, 2)
    assert report["partitions"]["val"]["call_pairs"] == 0 and report["partitions"]["val"]["ratio"] == 1.0

    assert main([db]) == 0
    assert "| train | 2 | 2.5 | 3 | 2 | 12 | 7 | 1.79 |" in capsys.readouterr().out
