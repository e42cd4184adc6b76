"""A run's directory as src/gpu/h200_run.sh leaves it once the run has ended ($WORK/results/NAME:
its pid, start time and the calcx server's store under services/), for the tests of the script's
status and packing. Each test writes the metrics, log and store rows it needs."""

from __future__ import annotations

from pathlib import Path

# no such process: the run has ended
ENDED_PID = 2147483646


def ended_run(work: Path, name: str) -> Path:
    """`$WORK/results/NAME` of an ended run, with an empty services/ for its store."""
    run = work / "results" / name
    (run / "services").mkdir(parents=True)
    (run / "pid").write_text(f"{ENDED_PID}\n")
    (run / "started").write_text("0\n")
    return run


def store_path(run: Path) -> Path:
    """Where the run's calcx server keeps its SQLite store."""
    return run / "services" / "calcx.db"
