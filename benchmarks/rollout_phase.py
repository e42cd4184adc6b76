"""The server's part of a rollout phase's start: one step's creates, as the trainer's sessions send them.

A training step starts every session of every GRPO group at once; each session opens its own
client (in the timed part, as in the trainer) and POSTs the bodies of its whole group (creation is idempotent on rollout_id), so a step
of G groups of n sessions sends G*n create requests of n bodies each: G first-creates and
G*(n-1) duplicates, all at once. This benchmark sends exactly that to a real server (SQLite,
no controller: nothing claims) with the trainer's own `GroupSpec.bodies()`, one
`AsyncCalcxClient` per session like `run_session`, and reports

- wall: from the requests' start until the last create is answered;
- created_at span: first to last `rollouts.created_at` of the step (the server's clock);
- the same two for a round of first-creates only (G requests) and of duplicates only
  (G*(n-1) requests for groups that already exist).

Every round uses fresh group ids on one server, after `--warmup` rounds.

    PYTHONPATH=src/python /opt/calcx-dev/bin/python benchmarks/rollout_phase.py --groups 32 --group 4 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src" / "python"))

from calcx.api.client import AsyncCalcxClient, CalcxClient  # noqa: E402
from calcx.data.generator import generate_split  # noqa: E402
from calcx.rehearse.stack import Stack, StackConfig  # noqa: E402
from calcx.trainer.rollouts.group import GroupSpec  # noqa: E402


def specs_for(rows: list[dict[str, Any]], group: int, step: int) -> list[GroupSpec]:
    return [
        GroupSpec(
            uid=f"r{step}g{g}",
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


async def send(server_url: str, key: str, specs: list[GroupSpec]) -> tuple[float, list[float]]:
    """All creates at once, each session opening its own client first as `run_session` does;
    (wall, created_at of every rollout)."""
    clients: list[AsyncCalcxClient] = []

    async def session(spec: GroupSpec) -> list[Any]:
        client = AsyncCalcxClient(server_url, key, timeout=120)
        clients.append(client)
        return await client.create_rollouts(spec.bodies())

    try:
        start = time.time()
        answers = await asyncio.gather(*(session(s) for s in specs))
        wall = time.time() - start
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))
    created = {r.rollout_id: r.created_at for answer in answers for r in answer}
    return wall, sorted(created.values())


def round_once(server_url: str, key: str, rows: list[dict[str, Any]], group: int, step: int) -> dict[str, float]:
    step_specs = specs_for(rows, group, 3 * step)
    wall, created = asyncio.run(send(server_url, key, step_specs))
    first_specs = [s for s in specs_for(rows, group, 3 * step + 1) if s.session_id == 0]
    first_wall, first_created = asyncio.run(send(server_url, key, first_specs))
    dup_specs = [s for s in specs_for(rows, group, 3 * step + 1) if s.session_id != 0]
    dup_wall, _ = asyncio.run(send(server_url, key, dup_specs))
    return {
        "step_wall": wall,
        "step_span": created[-1] - created[0],
        "first_wall": first_wall,
        "first_span": first_created[-1] - first_created[0],
        "dup_wall": dup_wall,
        "load": os.getloadavg()[0],
    }


def fmt(values: list[float]) -> str:
    return f"{1000 * statistics.median(values):.0f} ms ({1000 * min(values):.0f}-{1000 * max(values):.0f})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", type=int, default=32)
    p.add_argument("--group", type=int, default=4, help="sessions (and rollouts) per GRPO group")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--label", default="this tree")
    args = p.parse_args(argv)
    rows = generate_split("train", args.groups, seed=7)
    workdir = Path(tempfile.mkdtemp(prefix="calcx-rollout-phase-"))
    config = StackConfig(workdir=workdir)
    stack = Stack(config)
    results = []
    try:
        stack.start_server()
        with CalcxClient(stack.server_url, config.key) as sync:
            sync.health()
        for i in range(args.warmup + args.rounds):
            r = round_once(stack.server_url, config.key, rows, args.group, i)
            if i >= args.warmup:
                results.append(r)
                print("   " + ", ".join(f"{k} {v:.3f}" for k, v in r.items()), file=sys.stderr)
    finally:
        stack.stop()
    n = args.groups * args.group
    print(f"| {args.label}: {args.groups} groups x {args.group}, median (min-max) of {len(results)} | |")
    print("|---|---|")
    print(f"| step: {n} creates at once, wall | {fmt([r['step_wall'] for r in results])} |")
    print(f"| step: created_at span of its {n} rollouts | {fmt([r['step_span'] for r in results])} |")
    print(f"| {args.groups} first-creates at once, wall | {fmt([r['first_wall'] for r in results])} |")
    print(f"| {args.groups} first-creates, created_at span | {fmt([r['first_span'] for r in results])} |")
    print(f"| {n - args.groups} duplicate creates at once, wall | {fmt([r['dup_wall'] for r in results])} |")
    print(f"| load average | {statistics.median(r['load'] for r in results):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
