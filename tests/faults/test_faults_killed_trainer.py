"""A trainer SIGKILLed with rollouts running and queued, its server and controller living on, and
its run started again: the restart cancels the leftovers, which neither run first nor run again;
nothing is lost, and the new run's rollouts each run once."""

from __future__ import annotations

from typing import Any

import pytest

from calcx.faults.killed_trainer import problems, run_killed


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_killed(tmp_path_factory.mktemp("killed-trainer"), lambda msg: None)


def test_the_killed_trainer_left_work_running_and_queued(outcome: dict[str, Any]) -> None:
    states = list(outcome["at_kill"].values())
    assert "RUNNING" in states and "QUEUED" in states


def test_its_leftovers_are_cancelled_and_never_run_again(outcome: dict[str, Any]) -> None:
    assert outcome["lost"] == []
    assert outcome["old_started_after_cancel"] == []
    left = sorted(rid for rid, state in outcome["at_kill"].items() if state in ("QUEUED", "RUNNING"))
    assert outcome["cancelled"]
    for rid in left:  # cancelled, unless it finished between the kill and the cancel
        assert rid in outcome["cancelled"] or outcome["old_states"][rid] == ("SUCCEEDED", None)
    for rid in outcome["cancelled"]:
        assert outcome["old_states"][rid] == ("FAILED", "cancelled_by_api")


def test_the_restarted_run_runs_each_of_its_rollouts_once(outcome: dict[str, Any]) -> None:
    assert outcome["new_not_succeeded_once"] == []


def test_the_benchmark_counts_no_problem(outcome: dict[str, Any]) -> None:
    assert not problems(outcome)
