"""A run's start-up, from `calcx train`'s console (train.log) to its first step: each phase's seconds,
measured between the timestamped lines that Ray, verl and calcx print at its boundaries.

vLLM's replicas (weights, torch.compile, CUDA graphs) are one phase between verl's lines; the vLLM
server logs only warnings in a run, so its own "Loading weights took", "torch.compile takes" and
"Graph capturing finished in" lines show up, and are read, only where its INFO lines are kept. The
first validation and the first step are measured from calcx's own lines (calcx.trainer.run.progress,
said when the metrics file shows them: within the watch's poll, 2 s); older logs lack them.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from calcx.trainer.run.progress import FIRST_STEP, PROGRESS_PREFIX, VALIDATED, VERL_STARTING

STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:[,.](\d+))?")
# the boundaries, in the order a start passes them: a name, and text its line holds
BOUNDARIES = (
    ("verl starting", f"{PROGRESS_PREFIX} ", f" UTC {VERL_STARTING}"),
    ("Ray started", "Started a local Ray instance"),
    ("worker group", "create worker group"),
    ("actor ready", "actor and ref model engine initialized"),
    ("ready to fit", "all initialize finished, ready to fit"),
    ("validated", f"{PROGRESS_PREFIX} ", f" UTC {VALIDATED}"),
    ("first step", f"{PROGRESS_PREFIX} ", f" UTC {FIRST_STEP}"),
)
# a phase: its name, the boundaries it may start from (the first the log holds) and the one it ends at
PHASES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("Ray", ("verl starting",), "Ray started"),
    ("verl's data and workers", ("Ray started",), "worker group"),
    ("FSDP actor init", ("worker group",), "actor ready"),
    ("vLLM replicas (weights, torch.compile, CUDA graphs), reward loop, weight sync", ("actor ready",), "ready to fit"),
    ("first validation", ("ready to fit",), "validated"),
    # a run that validates only later (trainer.val_before_train=false) goes from ready to fit to its first step
    ("first step (and its metrics line)", ("validated", "ready to fit"), "first step"),
)
# the spans a log may measure whole: a name, its first and its last boundary
TOTALS = (
    ("Ray started to ready to fit", "Ray started", "ready to fit"),
    ("verl starting to first step", "verl starting", "first step"),
)
# vLLM's own measures (INFO lines): a name and the pattern of its seconds
VLLM_MEASURES = (
    ("vLLM weights load", re.compile(r"Loading weights took ([\d.]+) ?s")),
    ("vLLM torch.compile", re.compile(r"torch\.compile takes ([\d.]+) ?s in total")),
    ("vLLM CUDA graph capture", re.compile(r"Graph capturing finished in ([\d.]+) ?sec")),
)


def _stamp(line: str) -> datetime | None:
    match = STAMP.search(line)
    if match is None:
        return None
    fraction = float(f"0.{match.group(2)}") if match.group(2) else 0.0
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S").replace(microsecond=round(fraction * 1e6) % 1_000_000)


def boundaries(lines: list[str]) -> dict[str, datetime]:
    """Each boundary's time, from the first line that marks it and carries a timestamp."""
    seen: dict[str, datetime] = {}
    for line in lines:
        for name, *texts in BOUNDARIES:
            if name not in seen and all(text in line for text in texts) and (when := _stamp(line)) is not None:
                seen[name] = when
    return seen


def phases(text: str) -> list[tuple[str, float | None]]:
    """Each phase's seconds (None when a boundary of it is not in the log), then vLLM's own measures
    (summed over replicas and compile ranges) where its INFO lines are there."""
    lines = text.splitlines()
    seen = boundaries(lines)
    out: list[tuple[str, float | None]] = []
    for name, starts, end in PHASES:
        start = next((boundary for boundary in starts if boundary in seen), None)
        seconds = (seen[end] - seen[start]).total_seconds() if start is not None and end in seen else None
        out.append((name, seconds))
    for name, first, last in TOTALS:
        if first in seen and last in seen:
            out.append((name, (seen[last] - seen[first]).total_seconds()))
    for name, pattern in VLLM_MEASURES:
        found = [float(m.group(1)) for line in lines if (m := pattern.search(line))]
        if found:
            out.append((name, sum(found)))
    return out


def startup_table(logs: dict[str, Path]) -> str:
    """One column a run's train.log, one row a phase; "-" where the log does not say."""
    measured = {label: dict(phases(path.read_text(encoding="utf-8", errors="replace"))) for label, path in logs.items()}
    names = list(dict.fromkeys(name for run in measured.values() for name in run))
    lines = ["| phase | " + " | ".join(logs) + " |", "|---|" + "---:|" * len(logs)]
    for name in names:
        cells = [f"{run[name]:.1f}" if run.get(name) is not None else "-" for run in measured.values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
