"""Where one batch of concurrent rollouts spends the time when no model call is in flight.

On the GPU, the time in a rollout phase when no model call is inside the model server is GPU time
spent waiting for agents. This benchmark runs one batch the way a training step does (real server,
controller, local runner, real agent and MCP calculator, stub LLM): GRPO groups of `--group`
sessions, each creating its group and waiting for it with the trainer's own `settle_group` (the
server's long poll). From the server's records it then breaks every rollout into stages

    session request -> rollout created -> attempt claimed -> agent process started
    -> first model call sent -> last model call answered -> reward posted -> attempt terminal
    -> the session sees its group settled

and prints, for the batch, the time before the first model call was sent, the time after the last
one was answered until the last session returned, and the idle time between calls (the batch's wall
time minus the union of model-call intervals). "Agent process started" is the attempt's finish
minus the wall time the runner measured for the agent process.

    PYTHONPATH=src/python /opt/calcx-dev/bin/python benchmarks/agent_start.py --n 32 --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src" / "python"))

from calcx.api.client import AsyncCalcxClient, CalcxClient  # noqa: E402
from calcx.api.models import RecordedCall, Rollout  # noqa: E402
from calcx.common.stats import percentile, union_length  # noqa: E402
from calcx.data.generator import generate_split  # noqa: E402
from calcx.data.io import write_jsonl  # noqa: E402
from calcx.rehearse.stack import Stack, StackConfig  # noqa: E402
from calcx.trainer.rollouts.group import GroupSpec, settle_group  # noqa: E402

STAGES = (
    ("request -> created", "request", "created"),
    ("created -> claimed", "created", "claimed"),
    ("claimed -> agent started", "claimed", "agent_started"),
    ("agent started -> first call sent", "agent_started", "first_sent"),
    ("first call sent -> last call answered", "first_sent", "last_answered"),
    ("last call answered -> reward posted", "last_answered", "reward_posted"),
    ("reward posted -> attempt terminal", "reward_posted", "terminal"),
    ("attempt terminal -> session sees it", "terminal", "seen"),
    ("last call answered -> attempt terminal", "last_answered", "terminal"),
)


def call_span(call: RecordedCall) -> tuple[float, float]:
    """[sent, answered] of one recorded call (the gateway records it when answered)."""
    return call.created_at - call.latency_s, call.created_at


def rollout_marks(rollout: Rollout, calls: list[RecordedCall], request: float, seen: float) -> dict[str, float]:
    """The stage timestamps of one rollout's last attempt (server clock = this machine's clock)."""
    attempt = rollout.latest_attempt
    own = [call_span(c) for c in calls if c.attempt_id == attempt.attempt_id and c.status_code == 200]
    rewards = [e.created_at for e in rollout.events if e.attempt_id == attempt.attempt_id and e.event_type == "reward"]
    marks = {"request": request, "created": rollout.created_at, "seen": seen}
    if attempt.started_at is not None:
        marks["claimed"] = attempt.started_at
    if attempt.finished_at is not None:
        marks["terminal"] = attempt.finished_at
        if attempt.agent_seconds is not None:
            marks["agent_started"] = attempt.finished_at - attempt.agent_seconds
    if own:
        marks["first_sent"] = min(s for s, _ in own)
        marks["last_answered"] = max(e for _, e in own)
    if rewards:
        marks["reward_posted"] = min(rewards)
    return marks


async def run_batch(server_url: str, key: str, rows: list[dict[str, Any]], group: int, step: int) -> dict[str, Any]:
    """One batch: len(rows) groups' sessions at once, each settling its group like the trainer does."""
    client = AsyncCalcxClient(server_url, key, timeout=120)
    seen: dict[str, float] = {}
    specs = [
        GroupSpec(
            uid=f"b{step}g{g}",
            session_id=j,
            n=group,
            step=step,
            partition="train",
            row=row,
            env_map=None,
            deadline_s=120.0,
            max_attempts=1,
            wait_timeout_s=30.0,
            group_timeout_s=300.0,
        )
        for g, row in enumerate(rows)
        for j in range(group)
    ]

    async def session(spec: GroupSpec) -> None:
        try:
            await settle_group(client, spec)
        except Exception as exc:  # noqa: BLE001 - a failed rollout is reported in the table
            print(f"   session {spec.own_rollout_id()}: {type(exc).__name__}: {exc}", file=sys.stderr)
        seen[spec.own_rollout_id()] = time.time()

    try:
        request = time.time()
        await asyncio.gather(*(session(s) for s in specs))
        marks: list[dict[str, float]] = []
        spans: list[tuple[float, float]] = []
        states: dict[str, int] = {}
        for spec in specs:
            rid = spec.own_rollout_id()
            rollout = await client.get_rollout(rid)
            calls = await client.calls(rid)
            states[rollout.state] = states.get(rollout.state, 0) + 1
            marks.append(rollout_marks(rollout, calls, request, seen[rid]))
            spans += [call_span(c) for c in calls if c.status_code == 200]
    finally:
        await client.aclose()
    return {"request": request, "marks": marks, "spans": spans, "states": states}


def summarize(batch: dict[str, Any]) -> dict[str, Any]:
    """Per-stage p50/p95 over the batch's rollouts, and the batch's idle time around model calls."""
    marks, spans, request = batch["marks"], batch["spans"], batch["request"]
    stages = {}
    for label, a, b in STAGES:
        values = [m[b] - m[a] for m in marks if a in m and b in m]
        stages[label] = (percentile(values, 0.5, math.nan), percentile(values, 0.95, math.nan))
    last_seen = max(m["seen"] for m in marks)
    wall = last_seen - request
    busy = union_length(spans)
    head = (min(s for s, _ in spans) - request) if spans else math.nan
    tail = (last_seen - max(e for _, e in spans)) if spans else math.nan
    return {
        "n": len(marks),
        "states": batch["states"],
        "stages": stages,
        "wall_s": wall,
        "busy_s": busy,
        "idle_start_s": head,
        "idle_end_s": tail,
        "idle_between_s": wall - busy - head - tail,
    }


def report(label: str, results: list[dict[str, Any]]) -> str:
    """One markdown table: a column per measured batch."""
    head = f"| {label} | " + " | ".join(f"run {i + 1}" for i in range(len(results))) + " |"
    lines = [head, "|---|" + "---|" * len(results)]
    lines.append(
        "| rollouts | "
        + " | ".join(f"{r['n']} ({', '.join(f'{k} {v}' for k, v in sorted(r['states'].items()))})" for r in results)
        + " |"
    )
    lines.append("| load average before | " + " | ".join(f"{r['load']:.1f}" for r in results) + " |")
    for name, _, _ in STAGES:
        lines.append(
            f"| {name} p50 / p95 | "
            + " | ".join(f"{1000 * r['stages'][name][0]:.0f} / {1000 * r['stages'][name][1]:.0f} ms" for r in results)
            + " |"
        )
    for key, name in (
        ("wall_s", "batch wall (request -> last session returns)"),
        ("busy_s", "some model call in flight"),
        ("idle_start_s", "no call in flight: start (request -> first call sent)"),
        ("idle_between_s", "no call in flight: between calls"),
        ("idle_end_s", "no call in flight: end (last call answered -> last session returns)"),
    ):
        lines.append(f"| {name} | " + " | ".join(f"{r[key]:.2f} s" for r in results) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=32, help="rollouts in a batch (a multiple of --group)")
    p.add_argument("--group", type=int, default=4, help="sessions per GRPO group")
    p.add_argument("--concurrency", type=int, default=0, help="controller --concurrency (default: --n)")
    p.add_argument("--runs", type=int, default=3, help="measured batches, one after the other on one stack")
    p.add_argument("--warmup", type=int, default=1, help="batches run before measuring")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--label", default="batch", help="the table's first column heading (e.g. before/after)")
    args = p.parse_args(argv)
    if args.n % args.group:
        p.error("--n must be a multiple of --group")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: every process gets stopped
    groups = args.n // args.group
    rows = generate_split("train", groups * (args.runs + args.warmup), seed=args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="calcx-agent-start-"))
    data = workdir / "data.jsonl"
    write_jsonl(rows, data)
    config = StackConfig(workdir=workdir, concurrency=args.concurrency or args.n, script_files=[str(data)])
    results = []
    with Stack(config) as stack:
        with CalcxClient(stack.server_url, config.key) as sync:
            sync.health()
        for i in range(args.warmup + args.runs):
            load = os.getloadavg()[0]
            batch = asyncio.run(
                run_batch(stack.server_url, config.key, rows[i * groups : (i + 1) * groups], args.group, step=i)
            )
            if i >= args.warmup:
                summary = summarize(batch) | {"load": load}
                results.append(summary)
                print(
                    f"   run {len(results)}: wall {summary['wall_s']:.2f} s, idle start "
                    f"{summary['idle_start_s']:.2f} s, end {summary['idle_end_s']:.2f} s",
                    file=sys.stderr,
                )
    print(report(args.label, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
