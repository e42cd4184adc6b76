"""`calcx rehearse`: the whole rollout loop on this machine, without a GPU.

Starts the server, the stub LLM (registered as the model endpoint) and a controller with the
local runner, pushes a dataset through (each row n times, as one GRPO group), shows progress
and prints a summary. Every process it starts is ended before it returns.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from calcx.common.stats import percentile


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="calcx rehearse", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", help="Calc-X rows: a .parquet or .jsonl file (see 'calcx data generate')")
    src.add_argument("--generate", type=int, metavar="ROWS", help="use ROWS generated rows instead of a file")
    p.add_argument("--n", type=int, default=4, help="rollouts per row, one GRPO group (default 4)")
    p.add_argument("--limit", type=int, default=None, help="use only the first R rows")
    p.add_argument("--concurrency", type=int, default=8, help="rollouts run at once (default 8)")
    p.add_argument(
        "--mode",
        default="normal",
        help="stub LLM mode: normal, direct, wrong, noformat, badjson, unknowntool, error500, slow[=S], hang",
    )
    p.add_argument("--deadline-s", type=float, default=120.0, help="deadline of each rollout (default 120)")
    p.add_argument("--timeout-s", type=float, default=3600.0, help="give up waiting after this long (default 3600)")
    p.add_argument("--no-prefork", action="store_true", help="spawn one agent process per rollout (slower)")
    p.add_argument("--workdir", default=None, help="database and logs go here (default: a new temporary directory)")
    p.add_argument("--agent-logs", action="store_true", help="keep each rollout's agent output in the workdir")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _load_rows(args: argparse.Namespace, workdir: Path) -> tuple[list[dict[str, Any]], str]:
    from calcx.data.io import read_rows, write_jsonl

    if args.data:
        rows = read_rows(args.data)
        script = str(Path(args.data).resolve())
    else:
        from calcx.data.generator import generate_split

        rows = generate_split("train", args.generate, seed=0)
        path = workdir / "generated.jsonl"
        write_jsonl(rows, path)
        script = str(path)
    if args.limit is not None:
        rows = rows[: args.limit]
    return rows, script


def summarize(rollouts: list[Any], wall_s: float, expected: int) -> dict[str, Any]:
    """Counts by state and failure reason, rewards and latencies of terminal rollouts."""
    failed: dict[str, int] = {}
    rewards: list[float] = []
    latencies: list[float] = []
    succeeded = 0
    for r in rollouts:
        attempt = r.latest_attempt
        if r.state == "SUCCEEDED":
            succeeded += 1
            if r.reward is not None:
                rewards.append(r.reward)
        else:
            failed[attempt.reason or "unknown"] = failed.get(attempt.reason or "unknown", 0) + 1
        if attempt.finished_at is not None:
            latencies.append(attempt.finished_at - r.created_at)
    return {
        "rollouts": expected,
        "terminal": len(rollouts),
        "succeeded": succeeded,
        "failed": sum(failed.values()),
        "failed_by_reason": dict(sorted(failed.items())),
        "mean_reward": statistics.fmean(rewards) if rewards else None,
        "latency_p50_s": percentile(latencies, 0.50),
        "latency_p95_s": percentile(latencies, 0.95),
        "wall_s": wall_s,
        "rollouts_per_s": len(rollouts) / wall_s if wall_s > 0 else None,
    }


def format_summary(s: dict[str, Any]) -> str:
    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    reasons = ", ".join(f"{k} {v}" for k, v in s["failed_by_reason"].items()) or "none"
    lines = [
        f"rollouts      {s['terminal']}/{s['rollouts']} terminal",
        f"succeeded     {s['succeeded']}",
        f"failed        {s['failed']} ({reasons})",
        f"mean reward   {num(s['mean_reward'], '.3f')} (over succeeded rollouts)",
        f"latency       p50 {num(s['latency_p50_s'], '.2f')} s, p95 {num(s['latency_p95_s'], '.2f')} s (enqueue to terminal)",
        f"throughput    {num(s['rollouts_per_s'], '.2f')} rollouts/s over {s['wall_s']:.1f} s",
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from calcx.api.client import CalcxClient
    from calcx.data.schema import DataError
    from calcx.procs.managed import ProcessStartError
    from calcx.rehearse.stack import Stack, StackConfig

    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="calcx-rehearse-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        rows, script = _load_rows(args, workdir)
    except (DataError, OSError) as exc:
        print(f"calcx rehearse: {exc}", file=sys.stderr)
        return 2
    if not rows:
        print("calcx rehearse: no rows to run (empty file or --limit 0)", file=sys.stderr)
        return 2
    config = StackConfig(
        workdir=workdir,
        concurrency=args.concurrency,
        prefork=not args.no_prefork,
        stub_mode=args.mode,
        script_files=[script],
        agent_logs=args.agent_logs,
    )
    stack = Stack(config)
    print(f"calcx rehearse: starting server, stub LLM and controller (logs in {workdir})", file=sys.stderr)
    try:
        stack.start()
    except ProcessStartError as exc:
        print(f"calcx rehearse: {exc}", file=sys.stderr)
        return 1
    try:
        with CalcxClient(stack.server_url, config.key, timeout=60) as client:
            run_id = uuid.uuid4().hex[:8]
            specs = []
            for i, row in enumerate(rows):
                for k in range(args.n):
                    specs.append(
                        {
                            "rollout_id": f"rh-{run_id}-{i}-{k}",
                            "group_id": f"rh-{run_id}-{i}",
                            "row": row,
                            "deadline_s": args.deadline_s,
                            "max_attempts": 1,
                        }
                    )
            wanted = {s["rollout_id"] for s in specs}
            t0 = time.time()
            for start in range(0, len(specs), 1000):
                client.create_rollouts(specs[start : start + 1000])
            done = _wait_all(client, wanted, args)
            wall = time.time() - t0
        summary = summarize(list(done.values()), wall, len(wanted))
        summary.update(
            {
                "workdir": str(workdir),
                "mode": args.mode,
                "n": args.n,
                "rows": len(rows),
                "concurrency": args.concurrency,
                "prefork": not args.no_prefork,
            }
        )
    finally:
        stack.stop()
    print(format_summary(summary), file=sys.stderr)
    if args.json:
        print(json.dumps(summary, indent=2))
    return 0 if summary["terminal"] == summary["rollouts"] else 1


def _wait_all(client: Any, wanted: set[str], args: argparse.Namespace) -> dict[str, Any]:
    """Follow the server's terminal feed (long poll) until every rollout is terminal."""
    bar = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=len(wanted), file=sys.stderr, unit="rollout", dynamic_ncols=True)
    done: dict[str, Any] = {}
    cursor = 0
    limit = time.monotonic() + args.timeout_s
    try:
        while len(done) < len(wanted) and time.monotonic() < limit:
            page = client.terminal(after=cursor, limit=1000, timeout_s=min(10.0, max(0.0, limit - time.monotonic())))
            cursor = page.next
            for item in page.items:
                rid = item.rollout.rollout_id
                if rid in wanted and rid not in done:
                    done[rid] = item.rollout
                    if bar is not None:
                        bar.update(1)
                        failed = sum(1 for r in done.values() if r.state == "FAILED")
                        bar.set_postfix(failed=failed)
    finally:
        if bar is not None:
            bar.close()
    return done


def _raise_interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.n < 1 or args.concurrency < 1 or (args.limit is not None and args.limit < 0) or args.deadline_s <= 0:
        print("calcx rehearse: --n and --concurrency must be >= 1, --limit >= 0, --deadline-s > 0", file=sys.stderr)
        return 2
    if args.generate is not None and args.generate < 1:
        print("calcx rehearse: --generate must be >= 1", file=sys.stderr)
        return 2
    from calcx.stub_llm.modes import ModeError, parse_mode

    try:
        parse_mode(args.mode)
    except ModeError as exc:
        print(f"calcx rehearse: {exc}", file=sys.stderr)
        return 2
    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop every process started.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        return run(args)
    except KeyboardInterrupt:
        print("calcx rehearse: interrupted; stopped every process it started", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
