"""A small live run with faults injected: real server, stub LLM behind the fault proxy,
controller, agents and calculators, while an agent and a calculator are SIGKILLed, the server
is SIGKILLed and restarted on the same database, the controller is SIGKILLed and restarted, and
a hostile client hits every endpoint. Nothing may be lost, run twice or hang, and every
failure must carry its reason."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from calcx.faults.hostile import MAX_EVENTS_PER_ATTEMPT
from calcx.faults.plan import PLANNED, REFUSED_AT_CREATE, outcome_name
from calcx.faults.report import off_target, render_markdown
from calcx.faults.run import run_faults

N = 28
KINDS = [
    "agent-killed-mid-rollout",
    "calculator-killed-mid-rollout",
    "calculator-bomb-9**9**8",
    "calculator-bomb-string",
    "answer-import",
    "question-yaml-structure",
    "question-yaml-tags",
    "question-json-breakers",
    "question-shell",
    "question-template",
    "question-unicode",
    "question-long",
    "question-nul-byte",
]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    workdir: Path = tmp_path_factory.mktemp("faults-live")
    args = argparse.Namespace(
        n=N,
        kinds_each=1,
        kinds=KINDS,
        deadline_s=40.0,
        concurrency=6,
        lease_s=12.0,
        upstream_timeout_s=4.0,
        calculator_timeout_s=6.0,
        agent_timeout_s=30.0,
        timeout_s=150.0,
        schedule=[(0.25, "server-sigkill"), (0.45, "controller-restart")],
    )
    result = run_faults(args, workdir, lambda msg: None)
    result["workdir"] = workdir
    return result


def test_nothing_is_lost_run_twice_or_left_hanging(live: dict[str, Any]) -> None:
    audit = live["audit"]
    # The store's own state of every submitted rollout: the planned faults FAILED, the rest
    # (clean rows, hostile answers and texts) SUCCEEDED, whatever the process faults did.
    planned = Counter(PLANNED[kind][1][0] for kind in KINDS)
    assert audit["final_states"] == {"SUCCEEDED": planned["SUCCEEDED"] + N - len(KINDS), "FAILED": planned["FAILED"]}
    assert audit["lost"] == []
    assert audit["duplicates"] == []
    assert audit["succeeded_without_start"] == []
    assert live["hangs"] == []
    assert live["leftover_processes"] == []
    assert live["injector_errors"] == []


def test_rewards_are_kept_and_failures_carry_their_reason(live: dict[str, Any]) -> None:
    audit = live["audit"]
    assert audit["failed_without_reason"] == []
    assert audit["succeeded_without_reward"] == []
    assert audit["reward_mismatch"] == []
    assert live["agent_rewards_seen"] >= 15
    clean = audit["planned_outcomes"]["clean"]
    assert clean == {"SUCCEEDED": sum(clean.values())}


def test_every_planned_fault_was_injected_and_ended_as_planned(live: dict[str, Any]) -> None:
    kinds = {e["kind"].split(" (")[0] for e in live["events"]}
    assert {"agent killed", "calculator killed mid-rollout", "server restarted", "controller restarted"} <= kinds
    unexpected = [u for u in live["audit"]["unexpected"] if "nul-byte" not in u]
    assert unexpected == []
    assert not live["canary_exists"]
    # A planned fault whose every attempt a process fault cut short (controller lost, cancelled)
    # was never seen: the audit would not call it unexpected, so it is asserted here.
    assert live["audit"]["masked_by_process_faults"] == []
    for kind in KINDS:
        state, reason = PLANNED[kind][1]
        assert live["audit"]["planned_outcomes"][kind] == {outcome_name(state, reason): 1}, kind


def test_hostile_question_text_reaches_the_agent_exactly(live: dict[str, Any]) -> None:
    audit = live["audit"]
    assert audit["question_text_mismatch"] == []
    for name in ("yaml-structure", "yaml-tags", "json-breakers", "shell", "template", "unicode", "long"):
        assert audit["planned_outcomes"][f"question-{name}"] == {"SUCCEEDED": 1}, name


def test_hostile_client_got_the_right_answers_during_the_faults(live: dict[str, Any]) -> None:
    hostile = live["hostile"]
    assert hostile["wrong"] == []
    assert hostile["right"] >= 90
    # the event flood reached the per-attempt cap, and nothing past it was stored
    assert hostile["flood_refused"] > 0 and hostile["flood_stored"] <= MAX_EVENTS_PER_ATTEMPT


def test_calculator_bombs_get_a_tool_error_and_the_rollout_finishes(live: dict[str, Any]) -> None:
    """9**9**8 and '9'*10**8 once hung or filled the calculator: now refused at once, the
    model reads the refusal, and the rollout ends SUCCEEDED (its answer scored), not FAILED."""
    for kind in ("calculator-bomb-9**9**8", "calculator-bomb-string"):
        assert live["audit"]["planned_outcomes"][kind] == {"SUCCEEDED": 1}, kind


def test_service_recovers_after_each_restart(live: dict[str, Any]) -> None:
    recovery = {r["fault"].split(" (")[0]: r for r in live["recovery"]}
    assert set(recovery) == {"server restarted", "controller restarted"}
    for fault, r in recovery.items():
        assert r["next_success_s"] is not None, f"no rollout succeeded after the {fault}"
        assert r["next_success_s"] < 60, r


def test_question_no_environment_can_carry_is_refused_at_creation(live: dict[str, Any]) -> None:
    """A NUL byte cannot be put into a process environment, by either runner: the server refuses
    such a row when it is created (422), so it is never queued, claimed or retried, and the rest
    of the batch is not held up by it."""
    assert live["audit"]["planned_outcomes"]["question-nul-byte"] == {"REFUSED 422": 1}


def test_the_figures_are_on_target_and_the_table_shows_each(live: dict[str, Any]) -> None:
    """benchmarks/FAULTS.md's table and the benchmark's exit status come from one list of figures:
    the rows refused at creation count as rows of the run, and a planned fault that no attempt
    showed (each one cut short by a process fault) is off target, not silently passed."""
    assert off_target(live, N) == []
    table = render_markdown(argparse.Namespace(n=N), live, None, "command")
    refused = len([k for k in KINDS if k in REFUSED_AT_CREATE])
    assert (
        f"| rows in the run (submitted at once) | {N} ({N - refused} rollouts created, "
        f"{live['audit']['attempts']} attempts; {refused} refused at creation, 422) | >= {N} |"
    ) in table
    assert "| planned faults never seen (every attempt cut short by a process fault) | 0 | 0 |" in table
    masked = {**live, "audit": {**live["audit"], "masked_by_process_faults": ["f-1: every attempt ended cancelled"]}}
    assert off_target(masked, N) == ["planned faults never seen (every attempt cut short by a process fault)"]
