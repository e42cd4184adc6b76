"""A run a person can watch: one console line a step and the curves PNG redrawn at each validation.

verl's `file` logger appends one JSON line per `logger.log` call to the metrics file (the step's
metrics; validation's in the same line, or alone before training). `ProgressWatch` follows that
file from the driver, beside verl's own console logger, and for each new line prints

    calcx train: step 12/40 | reward 0.512 | val acc 0.620 | tool use 31% (val 40%) | 31.2 s/step |
        step 12: 30.4 s (generation 21.7 s) | ~15 min left

(the validation fields only when that step validated; `s/step` is the mean of verl's
`timing_s/step` over the last steps; then this step's time and its longest phase), and at every line with validation metrics redraws
`reward_curve.png` in the report directory (written beside and renamed, so a viewer never sees half
a file). A file verl truncates (a new run in the same directory) starts the watch over.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from calcx.trainer.run.report import (
    REWARD_KEYS,
    ReportError,
    plot_reward_curve,
    plot_validation_curve,
    reward_series,
    validation_by_source,
    validation_series,
)
from calcx.trainer.run_dir.names import CURVE_FILE

PROGRESS_PREFIX = "calcx train:"
STEP_TIME_KEY = "timing_s/step"
MEAN_OVER_STEPS = 5
MAX_LINE_BYTES = 16 * 1024 * 1024  # a metrics line past this is not verl's: skipped
# the start-up's boundaries the driver sees, said once each with the time (calcx.runs.startup reads
# them from train.log): verl started, the validation before training logged, the first step logged
VERL_STARTING, VALIDATED, FIRST_STEP = "verl starting", "validation before training logged", "first step logged"


def phase_line(event: str, now: float | None = None) -> str:
    """`calcx train: 2026-12-03 14:18:04 UTC first step logged`."""
    stamp = datetime.fromtimestamp(time.time() if now is None else now, UTC)
    return f"{PROGRESS_PREFIX} {stamp:%Y-%m-%d %H:%M:%S} UTC {event}"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# verl's timed phases inside a step (its `timing_s/step`), as the console line and the step table name
# them; validation (`timing_s/testing`) runs outside the step's time
STEP_PHASES = (
    ("timing_s/gen", "generation"),
    ("timing_s/old_log_prob", "old log-prob"),
    ("timing_s/ref", "ref log-prob"),
    ("timing_s/values", "values"),
    ("timing_s/adv", "advantage"),
    ("timing_s/update_critic", "critic update"),
    ("timing_s/update_actor", "update"),
    ("timing_s/update_weights", "weight sync"),
    ("timing_s/save_checkpoint", "checkpoint"),
)


def dominant_phase(metrics: Mapping[str, Any]) -> tuple[str, float] | None:
    """The phase of the step that took longest and its seconds (None when verl logged no phase)."""
    phases = [(seconds, name) for key, name in STEP_PHASES if (seconds := _number(metrics.get(key))) is not None]
    if not phases:
        return None
    seconds, name = max(phases)
    return name, seconds


def _step_time(step: int, metrics: Mapping[str, Any]) -> str:
    """`step 7: 11.3 s (generation 6.1 s)`: the step's own time and its longest phase ("" when verl
    timed no phase)."""
    total, phase = _number(metrics.get(STEP_TIME_KEY)), dominant_phase(metrics)
    if total is None or phase is None:
        return ""
    return f"step {step}: {total:.1f} s ({phase[0]} {phase[1]:.1f} s)"


def progress_line(step: int, metrics: Mapping[str, Any], *, total_steps: int | None, step_seconds: list[float]) -> str:
    """The console line of one metrics line (`metrics` flat, as verl logged it)."""
    parts = [f"step {step}/{total_steps}" if total_steps else f"step {step}"]
    reward = next((v for k in REWARD_KEYS if (v := _number(metrics.get(k))) is not None), None)
    if reward is not None:
        parts.append(f"reward {reward:.3f}")
    elif step == 0:
        parts.append("before training")
    by_source = validation_by_source(metrics)
    if len(by_source) > 1:
        parts.append("val acc " + ", ".join(f"{source} {value:.3f}" for source, value in by_source.items()))
    elif by_source:
        parts.append(f"val acc {next(iter(by_source.values())):.3f}")
    equal, entropy = _number(metrics.get("calcx/train/equal_reward_groups")), _number(metrics.get("actor/entropy"))
    if equal is not None:
        parts.append(f"equal-reward groups {equal:.0%}")
    if entropy is not None:
        parts.append(f"entropy {entropy:.3f}")
    train_use, val_use = _number(metrics.get("calcx/train/tool_use")), _number(metrics.get("calcx/val/tool_use"))
    if train_use is not None or val_use is not None:
        shown = "tool use"
        if train_use is not None:
            failures = _number(metrics.get("calcx/train/tool_parse_failures"))
            shown += f" {train_use:.0%}" + (f" ({failures:.0f} parse failures)" if failures else "")
        if val_use is not None:
            failures = _number(metrics.get("calcx/val/tool_parse_failures"))
            shown += f" (val {val_use:.0%}" + (f", {failures:.0f} parse failures)" if failures else ")")
        parts.append(shown)
    if step_seconds:
        mean = sum(step_seconds) / len(step_seconds)
        parts.append(f"{mean:.1f} s/step")
        if this_step := _step_time(step, metrics):
            parts.append(this_step)
        if total_steps and step < total_steps:
            parts.append(f"~{_duration(mean * (total_steps - step))} left")
    return f"{PROGRESS_PREFIX} " + " | ".join(parts)


def draw_curves(metrics: list[dict[str, Any]], out_png: Path) -> Path | None:
    """The run's curve so far (reward and validation; validation alone before the first step),
    written to a temporary file and renamed; None when there is nothing to draw yet."""
    tmp = out_png.with_name(f".{out_png.name}.tmp.png")
    try:
        reward_series(metrics)
        plot_reward_curve(metrics, tmp)
    except ReportError:
        points = validation_series(metrics)
        if not points:
            return None
        plot_validation_curve(points, tmp, metrics=metrics)
    os.replace(tmp, out_png)
    return out_png


class ProgressWatch:
    """Follows a verl metrics file; `poll()` handles what was appended since the last call."""

    def __init__(
        self,
        metrics_path: str | os.PathLike[str],
        report_dir: str | os.PathLike[str],
        *,
        total_steps: int | None,
        emit: Callable[[str], None] = print,
    ) -> None:
        self.metrics_path = Path(metrics_path)
        self.out_png = Path(report_dir) / CURVE_FILE
        self.total_steps = total_steps
        self.emit = emit
        self._reset()

    def _reset(self) -> None:
        self._offset = 0
        self._metrics: list[dict[str, Any]] = []
        self._step_seconds: deque[float] = deque(maxlen=MEAN_OVER_STEPS)
        self._said: set[str] = set()

    def _say_once(self, event: str) -> None:
        if event not in self._said:
            self._said.add(event)
            self.emit(phase_line(event))

    def poll(self) -> list[str]:
        """Print (and return) one line per complete new metrics line; redraw the curve after lines
        that carry validation metrics."""
        try:
            size = self.metrics_path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self._offset:  # truncated: verl opened it again for a new run
            self._reset()
        with open(self.metrics_path, "rb") as fh:
            fh.seek(self._offset)
            data = fh.read(max(0, size - self._offset))
        end = data.rfind(b"\n") + 1
        self._offset += end
        lines, validated = [], False
        for raw in data[:end].splitlines():
            if not raw.strip() or len(raw) > MAX_LINE_BYTES:
                continue
            try:
                record = json.loads(raw)
                step = int(record["step"])
                flat = dict(record.get("data") or {})
            except (ValueError, KeyError, TypeError):
                continue
            seconds = _number(flat.get(STEP_TIME_KEY))
            if seconds is not None:
                self._step_seconds.append(seconds)
                self._say_once(FIRST_STEP)
            elif step == 0:
                self._say_once(VALIDATED)
            self._metrics.append({**flat, "step": step})
            line = progress_line(step, flat, total_steps=self.total_steps, step_seconds=list(self._step_seconds))
            self.emit(line)
            lines.append(line)
            validated = validated or bool(validation_series([{**flat, "step": step}]))
        if validated:
            draw_curves(self._metrics, self.out_png)
        return lines

    @contextlib.contextmanager
    def running(self, interval_s: float = 2.0) -> Iterator[ProgressWatch]:
        """Poll in a daemon thread while the block runs; a last poll when it ends."""
        self._say_once(VERL_STARTING)
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(interval_s):
                self._poll_quietly()

        thread = threading.Thread(target=loop, name="calcx-progress", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join(timeout=interval_s + 5)
            self._poll_quietly()

    def _poll_quietly(self) -> None:
        # the watch must never stop training: a figure that cannot be drawn is said, not raised
        try:
            self.poll()
        except Exception as exc:  # noqa: BLE001
            self.emit(f"{PROGRESS_PREFIX} progress watch: {type(exc).__name__}: {exc}")


def total_training_steps(cfg: Any, train_rows: int) -> int | None:
    """verl's count: `trainer.total_training_steps`, else full batches a epoch times the epochs."""
    fixed = cfg.trainer.get("total_training_steps")
    if fixed is not None:
        return int(fixed)
    batch = int(cfg.data.train_batch_size)
    return (train_rows // batch) * int(cfg.trainer.total_epochs) if batch > 0 else None
