"""The watchable run: one console line a step and the curve redrawn at each validation, from a
metrics file written as verl's `file` logger writes it (one JSON line per log call, appended)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from calcx.trainer.run.progress import ProgressWatch, phase_line, progress_line, total_training_steps


def _log(path: Path, step: int, data: dict[str, Any], *, end: str = "\n") -> None:
    with open(path, "ab") as fh:
        fh.write((json.dumps({"step": step, "data": data}) + end).encode())


def _step(step: int, seconds: float, **extra: float) -> dict[str, Any]:
    return {"critic/score/mean": 0.1 * step, "timing_s/step": seconds, "calcx/train/tool_use": 0.05 * step, **extra}


def test_a_line_a_step_and_the_curve_at_each_validation(tmp_path: Path) -> None:
    metrics, report = tmp_path / "metrics.jsonl", tmp_path / "report"
    report.mkdir()
    shown: list[str] = []
    watch = ProgressWatch(metrics, report, total_steps=10, emit=shown.append)
    png = report / "reward_curve.png"
    assert watch.poll() == [] and not png.exists()  # verl has not opened the file yet

    _log(
        metrics,
        0,
        {"val-core/gsm8k/reward/mean@1": 0.125, "calcx/val/tool_use": 0.3, "calcx/val/tool_parse_failures": 4.0},
    )
    assert watch.poll() == [
        "calcx train: step 0/10 | before training | val acc 0.125 | " "tool use (val 30%, 4 parse failures)"
    ]
    first = png.read_bytes()
    assert first[:4] == b"\x89PNG"

    _log(metrics, 1, _step(1, 30.0))
    _log(metrics, 2, _step(2, 20.0), end="")  # verl is still writing this line
    assert watch.poll() == ["calcx train: step 1/10 | reward 0.100 | tool use 5% | 30.0 s/step | ~4 min left"]
    assert png.read_bytes() == first  # no validation: not redrawn
    with open(metrics, "ab") as fh:
        fh.write(b"\n")
    _log(metrics, 3, _step(3, 25.0, **{"val-core/gsm8k/reward/mean@1": 0.5, "calcx/val/tool_use": 0.6}))
    assert watch.poll() == [
        "calcx train: step 2/10 | reward 0.200 | tool use 10% | 25.0 s/step | ~3 min left",
        "calcx train: step 3/10 | reward 0.300 | val acc 0.500 | tool use 15% (val 60%) | 25.0 s/step | ~3 min left",
    ]
    assert png.read_bytes() != first and not list(report.glob(".*tmp*"))  # redrawn, renamed into place
    assert shown[-1].startswith("calcx train: step 3/10")

    metrics.write_bytes(b"")  # verl opens the file anew (`wb`): a new run in the same directory
    _log(metrics, 0, {"val-core/gsm8k/reward/mean@1": 0.2})
    assert watch.poll() == ["calcx train: step 0/10 | before training | val acc 0.200"]


def test_a_line_shows_each_validation_source_and_the_steps_signal() -> None:
    metrics = {
        "critic/score/mean": 0.5,
        "timing_s/step": 12.0,
        "calcx/train/tool_use": 0.9,
        "calcx/train/tool_parse_failures": 3.0,
        "calcx/train/equal_reward_groups": 0.25,
        "actor/entropy": 0.4321,
        "val-core/gsm8k/reward/mean@1": 0.7,
        "val-core/gsm8k-hard/reward/mean@1": 0.35,
        "calcx/val/tool_use": 0.95,
    }
    assert progress_line(20, metrics, total_steps=20, step_seconds=[12.0]) == (
        "calcx train: step 20/20 | reward 0.500 | val acc gsm8k 0.700, gsm8k-hard 0.350 | "
        "equal-reward groups 25% | entropy 0.432 | tool use 90% (3 parse failures) (val 95%) | 12.0 s/step"
    )


def test_a_line_names_the_phase_that_took_most_of_the_step() -> None:
    metrics = {
        "critic/score/mean": 0.5,
        "timing_s/step": 10.0,
        "timing_s/gen": 5.5,
        "timing_s/old_log_prob": 1.1,
        "timing_s/update_actor": 2.9,
        "timing_s/update_weights": 0.5,
    }
    assert progress_line(3, metrics, total_steps=None, step_seconds=[12.0, 10.0]) == (
        "calcx train: step 3 | reward 0.500 | 11.0 s/step | step 3: 10.0 s (generation 5.5 s)"
    )
    slow_update = {**metrics, "timing_s/update_actor": 6.0, "timing_s/testing": 40.0}  # validation is not in the step
    assert progress_line(3, slow_update, total_steps=None, step_seconds=[10.0]).endswith(
        "| step 3: 10.0 s (update 6.0 s)"
    )


def test_the_watch_runs_beside_training_and_never_stops_it(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    shown: list[str] = []
    not_a_dir = tmp_path / "report"
    not_a_dir.write_text("a file where the report directory should be")
    watch = ProgressWatch(metrics, not_a_dir, total_steps=None, emit=shown.append)

    def verl() -> None:
        for step in (1, 2, 3):
            _log(metrics, step, _step(step, 1.0))
            time.sleep(0.05)
        _log(metrics, 4, {"val-core/x/reward/mean@1": 0.5})  # its curve cannot be written: said, not raised

    with watch.running(interval_s=0.02):
        writer = threading.Thread(target=verl)
        writer.start()
        writer.join()
    phases = [line for line in shown if line.endswith((" UTC verl starting", " UTC first step logged"))]
    assert [line.rsplit(" UTC ", 1)[1] for line in phases] == ["verl starting", "first step logged"], shown
    steps = [line for line in shown if line not in phases]
    assert [line.split(" | ")[0] for line in steps[:4]] == [f"calcx train: step {s}" for s in (1, 2, 3, 4)]
    assert all("left" not in line for line in shown)  # no total: no estimate
    assert any(line.startswith("calcx train: progress watch: ") for line in steps[4:]), shown


def test_the_start_ups_boundaries_are_said_once_with_the_time(tmp_path: Path) -> None:
    """The validation before training (step 0) and the first timed step, each said once, in UTC."""
    assert (
        phase_line("first step logged", now=1_796_307_484.5) == "calcx train: 2026-12-03 14:18:04 UTC first step logged"
    )
    metrics, shown = tmp_path / "metrics.jsonl", list[str]()
    watch = ProgressWatch(metrics, tmp_path, total_steps=None, emit=shown.append)
    _log(metrics, 0, {"val-core/gsm8k/reward/mean@1": 0.2})
    _log(metrics, 0, {"val-aux/num_turns/mean": 2.0})  # a second validation-only line says nothing more
    _log(metrics, 1, _step(1, 10.0))
    _log(metrics, 2, _step(2, 10.0))
    watch.poll()
    events = [line.split(" UTC ", 1)[1] for line in shown if " UTC " in line]
    assert events == ["validation before training logged", "first step logged"]
    assert shown.index(next(line for line in shown if line.endswith("first step logged"))) == 3  # before step 1's line


def test_step_count_and_line_without_measurements() -> None:
    cfg = OmegaConf.create(
        {"trainer": {"total_training_steps": None, "total_epochs": 2}, "data": {"train_batch_size": 32}}
    )
    assert total_training_steps(cfg, 7273) == 227 * 2
    cfg.trainer.total_training_steps = 20
    assert total_training_steps(cfg, 7273) == 20
    assert progress_line(5, {}, total_steps=20, step_seconds=[]) == "calcx train: step 5/20"
    assert (
        progress_line(19, {}, total_steps=20, step_seconds=[3600.0])
        == "calcx train: step 19/20 | 3600.0 s/step | ~60 min left"
    )
