"""Controller concurrency sweep on CPU: the workload of rollout_throughput.py (a fresh stack per run,
pre-forked workers, the real agent and MCP calculator against the stub LLM, N rollouts submitted at
once) at several `--concurrency` values, each measured several times.

The repeats are interleaved (every value once, then every value again, ...) so that a change in the
machine's load over the sweep falls on every value alike rather than on the last ones measured. It
reports rollouts/s (median, min-max) and peak summed PSS (median) per value.

    PYTHONPATH=src/python nice /opt/calcx-dev/bin/python benchmarks/concurrency_sweep.py \
        --n 256 --values 4,8,12,16,24,32 --repeats 3 --write-results
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.rollout_throughput import run_mode  # noqa: E402

SECTION = "## Controller concurrency sweep"


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per concurrency value: rollouts/s median and range, PSS median, runs and failures."""
    by_value: dict[int, list[dict[str, Any]]] = {}
    for r in runs:
        by_value.setdefault(int(r["concurrency"]), []).append(r)
    rows = []
    for value in sorted(by_value):
        rs = by_value[value]
        rates = [r["rollouts_per_s"] for r in rs]
        rows.append(
            {
                "concurrency": value,
                "runs": len(rs),
                "rate_median": statistics.median(rates),
                "rate_min": min(rates),
                "rate_max": max(rates),
                "pss_median_gib": statistics.median(r["peak_pss_mb"] for r in rs) / 1024,
                "latency_p50_median_s": statistics.median(r["latency_p50_s"] for r in rs),
                "not_succeeded": sum(r["n"] - r["states"].get("SUCCEEDED", 0) for r in rs),
                "load_median": statistics.median(r["load_before"] for r in rs),
            }
        )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| concurrency | runs | rollouts/s median (min-max) | peak PSS sum, median | latency p50, median "
        "| not succeeded | load avg at start, median |"
    )
    sep = "|---|---|---|---|---|---|---|"
    body = [
        f"| {r['concurrency']} | {r['runs']} | {r['rate_median']:.2f} ({r['rate_min']:.2f}-{r['rate_max']:.2f}) "
        f"| {r['pss_median_gib']:.2f} GiB | {r['latency_p50_median_s']:.1f} s | {r['not_succeeded']} "
        f"| {r['load_median']:.1f} |"
        for r in rows
    ]
    return "\n".join([head, sep, *body])


def write_results(path: Path, rows: list[dict[str, Any]], command: str, n: int) -> None:
    """Replace (or append) this sweep's section of RESULTS.md; other sections stay as they are."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    section = f"""{SECTION} (`benchmarks/concurrency_sweep.py`)

Measured {stamp} on this machine ({os.cpu_count()} CPU cores, shared with other work while it ran;
the sweep ran under `nice`). {n} rollouts a run, pre-forked workers, stub LLM, the real agent and
calculator; a fresh stack for every run; repeats interleaved across the values. Command:

```
{command}
```

{table(rows)}

The ranges overlap where the machine's other load moved more than the concurrency did: read a
difference inside the min-max range as noise. PSS is the peak summed over every process of the
stack (pages shared copy-on-write with the pre-forked worker split between the processes).
"""
    previous = path.read_text() if path.exists() else "# Benchmark results\n"
    if SECTION in previous:
        before, _, after = previous.partition(SECTION)
        rest = after.split("\n## ", 1)
        tail = "\n## " + rest[1] if len(rest) > 1 else ""
        text = before + section + tail
    else:
        text = previous.rstrip("\n") + "\n\n" + section
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=256, help="rollouts in each measured batch")
    p.add_argument("--values", default="4,8,12,16,24,32", help="concurrency values, comma-separated")
    p.add_argument("--repeats", type=int, default=3, help="runs per value, interleaved")
    p.add_argument("--warmup", type=int, default=8, help="rollouts run before measuring, each run")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--timeout-s", type=float, default=900.0)
    p.add_argument("--workdir", default=None, help="keep logs here (default: a temporary directory)")
    p.add_argument("--json", default=None, help="also write every run's figures to this file")
    p.add_argument("--write-results", action="store_true", help="update benchmarks/RESULTS.md")
    p.add_argument("--from-json", default=None, help="summarize the runs a --json file holds; measure nothing")
    args = p.parse_args(argv)
    values = [int(v) for v in args.values.split(",") if v.strip()]
    if not values or min(values) < 1 or args.repeats < 1 or args.n < 1:
        p.error("--values must be positive integers, --repeats and --n at least 1")
    base = Path(args.workdir) if args.workdir else Path(tempfile.gettempdir())
    workdir = Path(tempfile.mkdtemp(prefix="calcx-sweep-", dir=base))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: every stack gets stopped
    runs: list[dict[str, Any]] = json.loads(Path(args.from_json).read_text()) if args.from_json else []
    for repeat in range(0 if args.from_json else args.repeats):
        for value in values:
            name = f"c{value}-r{repeat}"
            print(f"== {name}: {args.n} rollouts, concurrency {value}", file=sys.stderr)
            res = run_mode(name, True, args.n, args.warmup, value, args.seed, workdir, args.timeout_s)
            print(
                f"   {res['rollouts_per_s']:.2f} rollouts/s, PSS {res['peak_pss_mb']:.0f} MB, "
                f"load {res['load_before']:.1f}",
                file=sys.stderr,
            )
            runs.append(res)
            if args.json:
                Path(args.json).write_text(json.dumps(runs, indent=2))
    rows = summarize(runs)
    print(table(rows))
    if args.write_results:
        given = list(argv if argv is not None else sys.argv[1:])
        if args.from_json:  # the command that measured them, not the one that summarized them
            given = ["--n", str(args.n), "--values", args.values, "--repeats", str(args.repeats), "--write-results"]
        cmd = "PYTHONPATH=src/python nice /opt/calcx-dev/bin/python benchmarks/concurrency_sweep.py " + " ".join(
            a for a in given if not a.startswith(("--json", "--from-json"))
        )
        write_results(ROOT / "benchmarks" / "RESULTS.md", rows, cmd, args.n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
