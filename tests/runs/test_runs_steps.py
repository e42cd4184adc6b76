"""The step tables from a metrics file alone (`calcx.runs.steps`): verl's staleness as logged, each
step's dominant phase, the trainer's tool-use columns, the GPU's idle share (never negative) and its
summary over the steps that paid no start-up, a restarted run's first steps read from its starts file, and the summary lines.
"""

from __future__ import annotations

import json
from pathlib import Path

from calcx.runs import steps


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip(" |").split("|")]


def _log(path: Path, rows: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    return path


def test_a_steps_lines_are_merged_and_its_staleness_is_verls_own(tmp_path: Path) -> None:
    """The staleness column is verl's own metric, from the served versions calcx records; a log
    without it (an older run) shows "-", not 0. A step logged on two lines is one row."""
    log = _log(
        tmp_path / "metrics.jsonl",
        [
            {"step": 1, "data": {"timing_s/step": 2.0, "training/off_policy/trajectory_staleness/max": 0}},
            {"step": 2, "data": {"timing_s/step": 2.0, "training/off_policy/trajectory_staleness/max": 1}},
            {"step": 3, "data": {"timing_s/step": 2.0}},
            {"step": 3, "data": {"val-core/gsm8k/reward/mean@1": 0.5, "val-core/hard/reward/mean@1": 0.25}},
        ],
    )
    rows = steps.step_table(steps.read_metrics(log), None).splitlines()
    head = _cells(rows[0])
    column = head.index("trajectory staleness max")
    assert [_cells(r)[column] for r in rows[2:]] == ["0", "1", "-"]
    assert [_cells(r)[head.index("val accuracy")] for r in rows[2:]] == ["-", "-", "0.375"]
    assert [_cells(r)[head.index("GPU idle waiting for agents")] for r in rows[2:]] == ["n/a"] * 3


REPO = Path(__file__).resolve().parents[2]


def test_each_step_names_its_dominant_phase() -> None:
    """From the committed default run of 2026-12-03: step 1 spent 6.17 of its 13.37 s generating;
    validation (`timing_s/testing`, 42 s at step 10) runs outside the step and is never its phase; a
    step without phase timings shows "-"."""
    metrics = steps.read_metrics(REPO / "results" / "runs" / "2026-12-03-gsm8k-h200" / "metrics.jsonl")
    rows = steps.step_table(metrics, None).splitlines()
    column = _cells(rows[0]).index("dominant phase")
    by_step = {int(_cells(r)[0]): _cells(r)[column] for r in rows[2:]}
    assert by_step[1] == "generation 6.2 s (46%)"
    assert by_step[10] == "generation 3.6 s (42%)"
    slow_update = {
        4: {"timing_s/step": 10.0, "timing_s/gen": 3.0, "timing_s/update_actor": 6.0},
        5: {"timing_s/step": 1.0},
    }
    rows = steps.step_table(slow_update, None).splitlines()
    assert [_cells(r)[column] for r in rows[2:]] == ["update 6.0 s (60%)", "-"]


def test_evictions_and_mfu_are_read_under_verls_names() -> None:
    rows = steps.step_table(
        {
            3: {
                "timing_s/step": 2.0,
                "training/off_policy/evicted_samples": 27,
                "training/rollout_failure/evicted_samples": 1,
                "perf/mfu/actor": 0.2512,
            }
        },
        None,
    ).splitlines()
    head, cells = _cells(rows[0]), _cells(rows[2])
    assert cells[head.index("evicted samples: stale")] == "27"
    assert cells[head.index("evicted samples: failed")] == "1"
    assert cells[head.index("update MFU")] == "25.1%"
    # a validation-only line (no step time) has no row
    assert len(steps.step_table({0: {"val-core/gsm8k/reward/mean@1": 0.1}}, None).splitlines()) == 2


def test_the_trainers_tool_use_columns_come_out_as_logged(tmp_path: Path) -> None:
    log = _log(
        tmp_path / "metrics.jsonl",
        [
            {
                "step": 0,
                "data": {
                    "calcx/val/tool_use": 0.1,
                    "calcx/val/tool_parse_failures": 3.0,
                    "calcx/val/steps_computed": 0.75,
                },
            },
            {
                "step": 1,
                "data": {
                    "timing_s/step": 2.0,
                    "calcx/train/tool_use": 0.25,
                    "calcx/train/steps_computed": 0.5,
                    "calcx/train/tool_calls_per_rollout": 0.5,
                    "calcx/train/equal_reward_groups": 0.4,
                    "actor/entropy": 0.3121,
                },
            },
        ],
    )
    table = steps.tool_use_table(steps.read_metrics(log)).splitlines()
    assert table[0].startswith(
        "| step | equal-reward groups | entropy | train tool use | train steps computed | train calls / rollout |"
    )
    assert "| val tool use | val steps computed | val calls / rollout |" in table[0]
    assert _cells(table[2]) == ["0", "-", "-", "-", "-", "-", "-", "10%", "75%", "-", "3"]
    assert _cells(table[3]) == ["1", "40%", "0.312", "25%", "50%", "0.50", "-", "-", "-", "-", "-"]
    assert steps.tool_use_table({1: {"timing_s/step": 2.0}}) == ""


def test_the_gpus_wait_is_never_negative() -> None:
    """Calls inside vLLM can outlast the generation phase as verl timed it (their clocks are the
    server's): the step then had no wait, not a negative one."""
    m = {"timing_s/gen": 2.0, "timing_s/step": 10.0}
    assert steps.idle_share(m, 3.0) == 0.0
    assert steps.idle_share(m, 1.0) == 0.1
    assert steps.idle_share({"timing_s/gen": 2.0, "timing_s/step": 0}, 1.0) is None
    assert steps.idle_share(m, None) is None


def test_the_idle_summary_leaves_out_the_first_step_and_each_restarts_first(tmp_path: Path) -> None:
    three = {
        1: {"timing_s/gen": 7.0, "timing_s/step": 10.0},
        2: {"timing_s/gen": 3.5, "timing_s/step": 5.0},
        3: {"timing_s/gen": 3.0, "timing_s/step": 10.0},
    }
    busy = {1: 4.0, 2: 2.0, 3: 2.5}
    assert steps.idle_summary(three, busy) == (
        "GPU idle waiting for agents: mean 17.5% of a step over 2 steps after the first (largest 30.0%, step 2)"
    )
    assert steps.idle_summary({1: three[1], 2: three[2]}, {1: 4.0}) is None
    starts = tmp_path / "starts.jsonl"
    starts.write_text('{"first_step": 1, "checkpoint": null}\n{"first_step": 2, "checkpoint": "/c/global_step_1"}\n')
    assert steps.restarted_steps(starts) == {2} and steps.restarted_steps(None) == set()
    assert steps.restarted_steps(tmp_path / "absent.jsonl") == set()
    with starts.open("a") as fh:
        fh.write('{"first_st')  # a line cut short by a crash while it was written
    assert steps.restarted_steps(starts) == {2}
    # a start sets aside the rows from its first step on: it ends the earlier starts at or after it
    for firsts, restarted in (([1, 6, 1], set()), ([1, 1], set()), ([1, 11, 6], {6}), ([1, 6, 11], {6, 11})):
        (tmp_path / "more.jsonl").write_text("".join(json.dumps({"first_step": f}) + "\n" for f in firsts))
        assert steps.restarted_steps(tmp_path / "more.jsonl") == restarted, firsts
    assert steps.idle_summary(three, busy, steps.restarted_steps(starts)) == (
        "GPU idle waiting for agents: mean 5.0% of a step over 1 step after the first and step 2, the first "
        "after a restart (largest 5.0%, step 3)"
    )
    assert steps.step_time_line(three, {2}) == (
        "mean step time after the first, nor the first after a restart: 10.00 s (median 10.00 s over 1 steps)"
    )
    assert steps.step_time_line({1: three[1]}, set()) is None


def test_the_validation_line_is_the_mean_over_sources_by_step() -> None:
    metrics = {
        0: {"val-core/gsm8k/reward/mean@1": 0.1, "val-core/hard/reward/mean@1": 0.3},
        1: {"timing_s/step": 1.0},
        2: {"val-core/gsm8k/reward/mean@1": 0.5},
    }
    assert steps.validation_line(metrics) == "validation accuracy: step 0: 0.200, step 2: 0.500"
    assert steps.validation_line({1: {"timing_s/step": 1.0}}) is None
