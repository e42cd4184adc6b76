"""Per-step table of a verl run's metrics (verl's `file` logger JSONL), for docs/gpu-run.md.

    python3 src/gpu/step_table.py METRICS.jsonl [--calls calcx.db [--incomplete incomplete_groups.jsonl]]

With `--calls` (the calcx server's SQLite store), the GPU's idle share of each step while it
waited for agents is measured from the recorded model calls: the generation phase minus the union
of the intervals in which at least one call was inside vLLM, over the whole step; and the store's
agent table follows the step table: per step, the training rollouts, the share with a successful
calculator call, tool calls per rollout, tool-call parse failures (a `<tool_call>` in the text that
vLLM's parser did not turn into a call; all three counted by `calcx.trainer.tool_use`, as the
trainer's `calcx/train/...` metrics are), failed attempts (retried as new ones) and the largest policy-version lag of a call:
how many weight syncs behind the weights its rollout's step starts from (step - 1) the version that
answered it was (the server records the version it serves at the time of each call). With
`--incomplete` too, what the calls of the rollouts left out of their steps came back with.
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from calcx.trainer.tool_use import ToolUse, rollout_tool_use, tool_use_metrics  # noqa: E402


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


_TRAIN_ID = re.compile(r"^calcx-train-s(\d+)-")


def agent_stats(db: Path) -> dict[int, dict[str, float]]:
    """Per training step, from the recorded calls and attempts of `calcx-train-s{step}-*` rollouts.
    Calculator use is counted by `calcx.trainer.tool_use` (what the trainer logs as
    `calcx/train/...`), over each rollout's latest attempt that recorded calls."""
    con = sqlite3.connect(db)
    stats: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    by_attempt: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for rid, attempt_no, seq, request, response, version in con.execute(
            "select rollout_id, attempt_no, seq, request, response, policy_version from calls "
            "where status_code = 200"):
        match = _TRAIN_ID.match(str(rid))
        if not match:
            continue
        step = int(match.group(1))
        by_attempt[(str(rid), int(attempt_no))].append({"seq": seq, "request": request, "response": response})
        if version is not None:
            # a step-s rollout is on-policy when version s - 1 (the weights after step s - 1's
            # update) answers it; the lag is how many versions older the answering one was
            stats[step]["max_lag"] = max(stats[step]["max_lag"], (step - 1) - int(version))
    latest: dict[str, int] = {}
    for rid, attempt_no in by_attempt:
        latest[rid] = max(latest.get(rid, attempt_no), attempt_no)
    uses: dict[int, list[ToolUse]] = defaultdict(list)
    for rid, attempt_no in latest.items():
        calls = sorted(by_attempt[(rid, attempt_no)], key=lambda c: int(c["seq"]))
        match = _TRAIN_ID.match(rid)
        assert match is not None
        uses[int(match.group(1))].append(rollout_tool_use(calls))
    for rid, state in con.execute("select rollout_id, state from attempts"):
        match = _TRAIN_ID.match(str(rid))
        if match and state == "FAILED":
            stats[int(match.group(1))]["failed_attempts"] += 1
    for step, items in uses.items():
        measured = tool_use_metrics(items, "train")
        stats[step]["rollouts"] = len(items)
        stats[step]["tool_share"] = measured["calcx/train/tool_use"]
        stats[step]["calls_per_rollout"] = measured["calcx/train/tool_calls_per_rollout"]
        stats[step]["parse_failures"] = measured["calcx/train/tool_parse_failures"]
    return {k: dict(v) for k, v in stats.items()}


def evicted_calls(db: Path, incomplete: Path) -> str:
    """What the model calls of the rollouts left out of their steps (`incomplete_groups.jsonl`)
    came back with: HTTP status, vLLM's finish reason, and whether any response token arrived."""
    rollout_ids = sorted({json.loads(line)["rollout_id"] for line in incomplete.read_text().splitlines()
                          if line.strip()})
    con = sqlite3.connect(db)
    kinds: Counter[tuple[int, str, str]] = Counter()
    without_calls = 0
    for rid in rollout_ids:
        rows = con.execute("select status_code, response, length(response_token_ids) from calls "
                           "where rollout_id = ?", (rid,)).fetchall()
        without_calls += not rows
        for status, response, token_bytes in rows:
            try:
                finish = str(json.loads(response)["choices"][0].get("finish_reason"))
            except (TypeError, ValueError, KeyError, IndexError):
                finish = "(no choice)"
            kinds[(int(status), finish, "none" if not token_bytes else "some")] += 1
    lines = [f"{len(rollout_ids)} rollouts left out; {without_calls} of them recorded no call", "",
             "| HTTP status | finish reason | response tokens | calls |", "|---:|---|---|---:|"]
    lines += [f"| {status} | {finish} | {tokens} | {count} |" for (status, finish, tokens), count in sorted(kinds.items())]
    return "\n".join(lines)


def agent_table(stats: dict[int, dict[str, float]]) -> str:
    head = ["step", "rollouts", "successful calculator call", "tool calls / rollout", "tool-call parse failures",
            "failed attempts", "max policy lag"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for step in sorted(stats):
        m = stats[step]
        lines.append(f"| {step} | {int(m.get('rollouts', 0))} | {m.get('tool_share', 0.0):.0%} | "
                     f"{m.get('calls_per_rollout', 0.0):.2f} | {int(m.get('parse_failures', 0))} | "
                     f"{int(m.get('failed_attempts', 0))} | {int(m.get('max_lag', 0))} |")
    return "\n".join(lines)


TOOL_USE_COLUMNS = (("train tool use", "calcx/train/tool_use", "{:.0%}"),
                    ("train calls / rollout", "calcx/train/tool_calls_per_rollout", "{:.2f}"),
                    ("train parse failures", "calcx/train/tool_parse_failures", "{:.0f}"),
                    ("val tool use", "calcx/val/tool_use", "{:.0%}"),
                    ("val calls / rollout", "calcx/val/tool_calls_per_rollout", "{:.2f}"),
                    ("val parse failures", "calcx/val/tool_parse_failures", "{:.0f}"))


def tool_use_table(steps: dict[int, dict]) -> str:
    """The trainer's own `calcx/{train,val}/...` tool-use metrics per step ("" when the run logged
    none: an older run, or verl's own agent loop)."""
    rows = [(step, m) for step, m in sorted(steps.items()) if any(key in m for _, key, _ in TOOL_USE_COLUMNS)]
    if not rows:
        return ""
    lines = ["| step | " + " | ".join(name for name, _, _ in TOOL_USE_COLUMNS) + " |",
             "|" + "---:|" * (len(TOOL_USE_COLUMNS) + 1)]
    for step, m in rows:
        cells = [fmt.format(m[key]) if key in m else "-" for _, key, fmt in TOOL_USE_COLUMNS]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _staleness(m: dict) -> str:
    """verl's largest trajectory staleness of the step's batch: the trained step minus one minus the
    newest policy version that served a trajectory (0: on-policy)."""
    value = m.get("training/off_policy/trajectory_staleness/max")
    return "-" if value is None else f"{value:.0f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def table(steps: dict[int, dict], busy: dict[int, float] | None) -> str:
    """One row a step. Evicted samples are counted by why verl left them out: a group with a failed
    attempt (`rollout_failure`) or one older than the allowed staleness (`off_policy`, async)."""
    head = ["step", "step s", "rollout (gen) s", "old log-prob s", "update s", "weight sync s",
            "tokens/s", "update MFU", "GPU mem peak GB", "GPU idle waiting for agents", "mean reward",
            "val accuracy", "trajectory staleness max", "evicted samples: failed", "evicted samples: stale"]
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
                 _percent(m.get("perf/mfu/actor")),
                 f"{m.get('actor/perf/max_memory_allocated_gb', float('nan')):.1f}", idle,
                 f"{m.get('critic/score/mean', float('nan')):.3f}", f"{statistics.mean(val):.3f}" if val else "-",
                 _staleness(m), f"{m.get('training/rollout_failure/evicted_samples', 0):.0f}",
                 f"{m.get('training/off_policy/evicted_samples', 0):.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("metrics", type=Path)
    parser.add_argument("--calls", type=Path, help="the calcx server's SQLite store of the run")
    parser.add_argument("--incomplete", type=Path,
                        help="the run's incomplete_groups.jsonl: with --calls, what their calls came back with")
    args = parser.parse_args(argv)
    steps = read_metrics(args.metrics)
    print(table(steps, busy_seconds_by_step(args.calls) if args.calls else None))
    tool_use = tool_use_table(steps)
    if tool_use:
        print()
        print(tool_use)
    if args.calls:
        print()
        print(agent_table(agent_stats(args.calls)))
        if args.incomplete and args.incomplete.is_file():
            print()
            print(evicted_calls(args.calls, args.incomplete))
    validation = [(step, statistics.mean(v for k, v in m.items() if k.startswith("val-core/") and k.endswith("mean@1")))
                  for step, m in sorted(steps.items())
                  if any(k.startswith("val-core/") and k.endswith("mean@1") for k in m)]
    if validation:
        print("\nvalidation accuracy: " + ", ".join(f"step {step}: {acc:.3f}" for step, acc in validation))
    after_first = [m["timing_s/step"] for s, m in sorted(steps.items()) if "timing_s/step" in m][1:]
    if after_first:
        print(f"\nmean step time after the first: {statistics.mean(after_first):.2f} s "
              f"(median {statistics.median(after_first):.2f} s over {len(after_first)} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
