"""Per-step table of a verl run's metrics (verl's `file` logger JSONL), for docs/gpu-run.md.

    python3 src/gpu/step_table.py METRICS.jsonl [--calls calcx.db] [--label calcx]

With `--calls` (the calcx server's SQLite store), the GPU's idle share of each step while it
waited for agents is measured from the recorded model calls: the generation phase minus the union
of the intervals in which at least one call was inside vLLM, over the whole step.
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def read_metrics(path: Path) -> dict[int, dict]:
    steps: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            steps.setdefault(int(row["step"]), {}).update(row["data"])
    return steps


def busy_seconds_by_step(db: Path) -> dict[int, float]:
    """Union length of [end - latency, end] call intervals, per training step (from the rollout
    id `calcx-train-s{step}-...` the AgentLoop gives each rollout)."""
    con = sqlite3.connect(db)
    intervals: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for created, latency, rid in con.execute(
            "select created_at, latency_s, rollout_id from calls where status_code = 200"):
        match = re.match(r"calcx-train-s(\d+)-", str(rid))
        if match:
            intervals[int(match.group(1))].append((float(created) - float(latency), float(created)))
    busy = {}
    for step, spans in intervals.items():
        total, end = 0.0, float("-inf")
        for start, stop in sorted(spans):
            if stop <= end:
                continue
            total += stop - max(start, end)
            end = stop
        busy[step] = total
    return busy


def table(steps: dict[int, dict], busy: dict[int, float] | None) -> str:
    head = ["step", "step s", "rollout (gen) s", "old log-prob s", "update s", "weight sync s",
            "tokens/s", "GPU mem peak GB", "GPU idle waiting for agents", "mean reward", "val accuracy"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for step in sorted(steps):
        m = steps[step]
        if "timing_s/step" not in m:
            continue
        idle = "n/a"
        if busy is not None:
            b = busy.get(step)
            if b is not None:
                idle = f"{max(0.0, m['timing_s/gen'] - b) / m['timing_s/step']:.0%}"
        val = [v for k, v in m.items() if k.startswith("val-core/") and k.endswith("mean@1")]
        cells = [str(step), f"{m['timing_s/step']:.2f}", f"{m.get('timing_s/gen', float('nan')):.2f}",
                 f"{m.get('timing_s/old_log_prob', float('nan')):.2f}", f"{m.get('timing_s/update_actor', float('nan')):.2f}",
                 f"{m.get('timing_s/update_weights', float('nan')):.2f}", f"{m.get('perf/throughput', float('nan')):.0f}",
                 f"{m.get('actor/perf/max_memory_allocated_gb', float('nan')):.1f}", idle,
                 f"{m.get('critic/score/mean', float('nan')):.3f}", f"{statistics.mean(val):.3f}" if val else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("metrics", type=Path)
    parser.add_argument("--calls", type=Path, help="the calcx server's SQLite store of the run")
    args = parser.parse_args(argv)
    steps = read_metrics(args.metrics)
    print(table(steps, busy_seconds_by_step(args.calls) if args.calls else None))
    after_first = [m["timing_s/step"] for s, m in sorted(steps.items()) if "timing_s/step" in m][1:]
    if after_first:
        print(f"\nmean step time after the first: {statistics.mean(after_first):.2f} s "
              f"(median {statistics.median(after_first):.2f} s over {len(after_first)} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
