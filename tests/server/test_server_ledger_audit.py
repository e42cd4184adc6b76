"""`calcx ledger` reads a run's training ledger from the server's store (read-only, with the server
running) and says whether each rollout was trained at most once, every surviving step is whole,
and nothing of the run is left in flight; a broken ledger is named and exits 1."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from calcx.api.client import CalcxClient
from calcx.cli import main as calcx_main
from calcx.contract.labels import RUN_LABEL
from calcx.server.ledger_audit import audit


def _succeed(client: CalcxClient, run: str, ids: list[str], group: str, problem: str = "p") -> None:
    client.create_rollouts(
        [
            {
                "rollout_id": rid,
                "group_id": group,
                "row": {"id": problem, "question": "q", "result": "1"},
                "labels": {RUN_LABEL: run},
            }
            for rid in ids
        ]
    )
    for claim in client.claim("ctl", len(ids), timeout_s=2).claims:
        client.post_event(claim.rollout.rollout_id, claim.attempt_id, "reward", {"value": 1.0})
        client.finish(claim.rollout.rollout_id, claim.attempt_id, "SUCCEEDED")


def _resumed_run(client: CalcxClient, redrawn_problem: str = "p2") -> None:
    """Steps 1-3 trained (one problem a step, a group of two), the trainer died, the run resumed from
    step 1's checkpoint and trained 2 again (drawing `redrawn_problem`; the data loader's position
    gives step 2's own problem, p2)."""
    for step, ids in ((1, ["a", "b"]), (2, ["c", "d"]), (3, ["e", "f"])):
        _succeed(client, "r", ids, f"g{step}", f"p{step}")
        client.record_trained("r", step, ids)
    assert client.rewind("r", 1) == [2, 3]
    _succeed(client, "r", ["c2", "d2"], "g2b", redrawn_problem)
    client.record_trained("r", 2, ["c2", "d2"])
    _succeed(client, "other", ["x"], "gx")  # another run's rollouts are not this run's business
    client.record_trained("other", 1, ["x"])


def test_a_resumed_run_is_reported_whole_and_trained_once(
    client: CalcxClient, db_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _resumed_run(client)
    result = audit(Path(db_path), "r")  # the server is still running: the file is opened read-only
    assert result.check(2) == []
    assert result.steps == [(1, 2, 1, 2), (2, 2, 1, 2)]
    assert result.rolled_back == [(2, 2), (3, 2)]
    assert result.in_flight == 0 and result.trained_twice == []
    assert ("SUCCEEDED", "", 8) in result.outcomes
    assert result.not_redrawn == [] and (result.distinct_problems, result.step_problems) == (2, 2)

    assert calcx_main(["ledger", "--db", db_path, "--run", "r", "--batch-rollouts", "2"]) == 0
    out = capsys.readouterr().out
    assert "rollouts trained more than once: 0" in out and "| 2 | 2 | 1 | 2 |" in out
    assert "2 (2 rollouts), 3 (2 rollouts)" in out and out.rstrip().endswith("OK")
    assert "problems trained (rows' id): 2 distinct over 2 (step, problem) pairs (0 came back" in out
    assert calcx_main(["ledger", "--db", db_path, "--run", "r", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == [[1, 2, 1, 2], [2, 2, 1, 2]]


def test_a_broken_ledger_is_named_and_exits_1(
    client: CalcxClient, db_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _resumed_run(client)
    client.create_rollouts(
        [{"rollout_id": "left", "row": {"question": "q", "result": "1"}, "labels": {RUN_LABEL: "r"}}]
    )
    with sqlite3.connect(db_path) as db:  # what the server's unique index never lets happen
        db.execute("DROP INDEX trained_once")
        db.execute("INSERT INTO trained VALUES ('r', 4, 'a', 1, 0, NULL)")
    assert calcx_main(["ledger", "--db", db_path, "--run", "r", "--batch-rollouts", "3"]) == 1
    out = capsys.readouterr().out
    assert "rollout a trained 2 times" in out
    assert "the surviving steps are not 1..3: [1, 2, 4]" in out
    assert "step 1: 2 rollouts, not a whole batch of 3" in out
    assert "1 rollout(s) of the run still QUEUED or RUNNING" in out


def test_a_rerun_step_that_drew_other_problems_is_named(
    client: CalcxClient, db_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The resumed run's step 2 drew step 1's problem again instead of its own: p2 was skipped and
    p1 came back within the epoch."""
    _resumed_run(client, redrawn_problem="p1")
    result = audit(Path(db_path), "r")
    assert result.not_redrawn == [(2, 1)] and (result.distinct_problems, result.step_problems) == (1, 2)
    assert calcx_main(["ledger", "--db", db_path, "--run", "r"]) == 1
    out = capsys.readouterr().out
    assert "step 2: 1 problem(s) the rolled-back step drew were not drawn when it ran again" in out
    assert "1 distinct over 2 (step, problem) pairs (1 came back at a later step" in out


def test_a_missing_database_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert calcx_main(["ledger", "--db", str(tmp_path / "none.db"), "--run", "r"]) == 2
    assert "no server database at" in capsys.readouterr().err
    assert not (tmp_path / "none.db").exists()  # read-only: nothing created
