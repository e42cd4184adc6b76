"""Rollout throughput of the whole loop on CPU: server + controller + local runner + real agent +
real MCP calculator against the stub LLM, with generated Calc-X data.

For each mode (pre-forked workers, then plain spawn for comparison) it starts a fresh stack,
warms it up, submits N rollouts at once and waits for all of them to be terminal. It reports
rollouts/s, enqueue-to-terminal latency, orchestration overhead (time RUNNING minus the time
inside the agent process), CPU seconds per component and peak memory of all processes.

    PYTHONPATH=src/python /opt/calcx-dev/bin/python benchmarks/rollout_throughput.py \
        --n 256 --concurrency 24 --compare-n 32 --write-results
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src" / "python"))

from calcx.api.client import CalcxClient  # noqa: E402
from calcx.common.stats import percentile  # noqa: E402
from calcx.controller.concurrency import default_concurrency  # noqa: E402
from calcx.data.generator import generate_split  # noqa: E402
from calcx.data.io import write_jsonl  # noqa: E402
from calcx.procs.procutil import cpu_seconds, descendants, pss_bytes, rss_bytes  # noqa: E402
from calcx.rehearse.stack import Stack, StackConfig  # noqa: E402
from calcx.worker.protocol import WORKER_MODULE  # noqa: E402


class MemorySampler(threading.Thread):
    """Peak summed RSS and PSS of every process of the stack, sampled every `period_s`."""

    def __init__(self, roots: list[int], period_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.roots = roots
        self.period_s = period_s
        self.peak_rss = 0
        self.peak_pss = 0
        self.peak_procs = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.period_s):
            pids: set[int] = set()
            for root in self.roots:
                pids.add(root)
                pids |= descendants(root)
            self.peak_rss = max(self.peak_rss, sum(rss_bytes(p) for p in pids))
            self.peak_pss = max(self.peak_pss, sum(pss_bytes(p) for p in pids))
            self.peak_procs = max(self.peak_procs, len(pids))

    def stop(self) -> None:
        self._halt.set()
        self.join(5)


def cpu_snapshot(stack: Stack) -> dict[str, float]:
    """CPU seconds (own + reaped children) of each long-lived process of the stack."""
    out: dict[str, float] = {}
    assert stack.server and stack.stub
    out["server"] = cpu_seconds(stack.server.pid)
    out["stub_llm"] = cpu_seconds(stack.stub.pid)
    controller = stack.controllers[0]
    out["controller"] = cpu_seconds(controller.pid, children=False)
    out["controller_children"] = cpu_seconds(controller.pid) - out["controller"]
    for pid in descendants(controller.pid):
        # live children of the controller: the worker (zygote) and, in spawn mode, agents
        out["controller_children"] += cpu_seconds(pid, children=True) if _is_child(pid, controller.pid) else 0.0
    return out


def zygote_stats(stack: Stack) -> dict[str, float]:
    """Cumulative counters of the controller's pre-forked worker (agent and calculator CPU)."""
    import socket as _socket

    for pid in descendants(stack.controllers[0].pid):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if WORKER_MODULE.encode() in argv and b"--socket" in argv:
            path = argv[argv.index(b"--socket") + 1].decode()
            with _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM) as sock:
                sock.settimeout(5)
                sock.connect(path)
                sock.sendall(b'{"op": "stats"}\n')
                data = b""
                while not data.endswith(b"\n"):
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    data += chunk
            return json.loads(data).get("stats", {})
    return {}


def _is_child(pid: int, parent: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[1].split()[1]) == parent
    except (OSError, ValueError):
        return False


def submit_and_wait(
    client: CalcxClient, rows: list[dict[str, Any]], prefix: str, deadline_s: float, timeout_s: float
) -> tuple[float, float, list[Any]]:
    """Create one rollout per row at once; wait on the terminal feed until all are terminal."""
    cursor = client.terminal(after=0, limit=1, timeout_s=0).next
    page = client.terminal(after=cursor, limit=1000, timeout_s=0)
    while page.items:
        cursor = page.next
        page = client.terminal(after=cursor, limit=1000, timeout_s=0)
    ids = {f"{prefix}-{i:05d}" for i in range(len(rows))}
    specs = [
        {
            "rollout_id": f"{prefix}-{i:05d}",
            "group_id": f"{prefix}-g{i}",
            "row": row,
            "deadline_s": deadline_s,
            "max_attempts": 1,
        }
        for i, row in enumerate(rows)
    ]
    t0 = time.time()
    for start in range(0, len(specs), 500):
        client.create_rollouts(specs[start : start + 500])
    done: dict[str, Any] = {}
    end = t0
    limit = time.monotonic() + timeout_s
    while len(done) < len(ids) and time.monotonic() < limit:
        page = client.terminal(after=cursor, limit=1000, timeout_s=10)
        cursor = page.next
        for item in page.items:
            if item.rollout.rollout_id in ids:
                done[item.rollout.rollout_id] = item.rollout
                end = time.time()
    return t0, end, list(done.values())


def run_mode(
    name: str, prefork: bool, n: int, warmup: int, concurrency: int, seed: int, workdir: Path, timeout_s: float
) -> dict[str, Any]:
    rows = generate_split("train", n + warmup, seed=seed)
    data = workdir / f"{name}-data.jsonl"
    write_jsonl(rows, data)
    config = StackConfig(workdir=workdir / name, concurrency=concurrency, prefork=prefork, script_files=[str(data)])
    stack = Stack(config)
    load_before = os.getloadavg()[0]
    t_start = time.monotonic()
    stack.start()
    startup_s = time.monotonic() - t_start
    try:
        client = CalcxClient(stack.server_url, config.key, timeout=60)
        t_w = time.monotonic()
        if warmup:
            submit_and_wait(client, rows[:warmup], f"{name}-warm", 120, timeout_s)
        warmup_s = time.monotonic() - t_w
        sampler = MemorySampler([p.pid for p in stack.processes()])
        sampler.start()
        cpu0 = cpu_snapshot(stack)
        z0 = zygote_stats(stack)
        c0 = time.monotonic()
        t0, end, rollouts = submit_and_wait(client, rows[warmup:], name, 300, timeout_s)
        wall = max(end - t0, 1e-9)
        cpu1 = cpu_snapshot(stack)
        z1 = zygote_stats(stack)
        sampler.stop()
        measured_s = time.monotonic() - c0
    finally:
        stack.stop()
    latencies, overheads, agent_s, running_s, queue_s = [], [], [], [], []
    states: dict[str, int] = {}
    rewards = []
    for r in rollouts:
        a = r.latest_attempt
        key = r.state if r.state == "SUCCEEDED" else f"FAILED:{a.reason}"
        states[key] = states.get(key, 0) + 1
        if r.reward is not None:
            rewards.append(r.reward)
        if a.finished_at is None:
            continue
        latencies.append(a.finished_at - r.created_at)
        if a.started_at is not None:
            running_s.append(a.finished_at - a.started_at)
            queue_s.append(a.started_at - r.created_at)
            if a.agent_seconds is not None:
                agent_s.append(a.agent_seconds)
                overheads.append((a.finished_at - a.started_at) - a.agent_seconds)
    cpu = {k: cpu1.get(k, 0.0) - cpu0.get(k, 0.0) for k in cpu1}
    if z1:
        cpu["agents"] = z1.get("agent_cpu_s", 0.0) - z0.get("agent_cpu_s", 0.0)
        cpu["calculators"] = z1.get("calc_cpu_s", 0.0) - z0.get("calc_cpu_s", 0.0)
    total_cpu = sum(v for k, v in cpu.items() if k not in ("agents", "calculators"))
    return {
        "mode": name,
        "prefork": prefork,
        "n": n,
        "completed": len(rollouts),
        "concurrency": concurrency,
        "states": states,
        "mean_reward": statistics.fmean(rewards) if rewards else None,
        "wall_s": wall,
        "rollouts_per_s": len(rollouts) / wall,
        "latency_p50_s": percentile(latencies, 0.5, math.nan),
        "latency_p95_s": percentile(latencies, 0.95, math.nan),
        "queue_p50_s": percentile(queue_s, 0.5, math.nan),
        "running_p50_s": percentile(running_s, 0.5, math.nan),
        "agent_p50_s": percentile(agent_s, 0.5, math.nan),
        "overhead_p50_ms": percentile(overheads, 0.5, math.nan) * 1000,
        "overhead_p95_ms": percentile(overheads, 0.95, math.nan) * 1000,
        "cpu_s": cpu,
        "cpu_s_total": total_cpu,
        "cpu_ms_per_rollout": 1000 * total_cpu / max(1, len(rollouts)),
        "cpu_cores_busy": total_cpu / max(measured_s, 1e-9),
        "peak_rss_mb": sampler.peak_rss / 2**20,
        "peak_pss_mb": sampler.peak_pss / 2**20,
        "peak_processes": sampler.peak_procs,
        "load_before": load_before,
        "startup_s": startup_s,
        "warmup_s": warmup_s,
    }


def _per(r: dict[str, Any], key: str) -> str:
    if key not in r["cpu_s"]:
        return "-"
    return f"{1000 * r['cpu_s'][key] / max(1, r['completed']):.0f} ms"


def table(results: list[dict[str, Any]]) -> str:
    rows = [
        ("rollouts", lambda r: f"{r['completed']}/{r['n']}"),
        ("concurrency", lambda r: str(r["concurrency"])),
        ("states", lambda r: ", ".join(f"{k} {v}" for k, v in sorted(r["states"].items()))),
        ("mean reward", lambda r: f"{r['mean_reward']:.3f}" if r["mean_reward"] is not None else "-"),
        ("rollouts/s", lambda r: f"{r['rollouts_per_s']:.2f}"),
        ("latency p50 / p95 (enqueue->terminal)", lambda r: f"{r['latency_p50_s']:.2f} s / {r['latency_p95_s']:.2f} s"),
        ("time RUNNING p50", lambda r: f"{r['running_p50_s']:.3f} s"),
        ("time inside the agent p50", lambda r: f"{r['agent_p50_s']:.3f} s"),
        (
            "orchestration overhead p50 / p95",
            lambda r: f"{r['overhead_p50_ms']:.1f} ms / {r['overhead_p95_ms']:.1f} ms",
        ),
        ("CPU per rollout (all processes)", lambda r: f"{r['cpu_ms_per_rollout']:.0f} ms"),
        ("  server", lambda r: f"{1000 * r['cpu_s']['server'] / max(1, r['completed']):.0f} ms"),
        ("  stub LLM", lambda r: f"{1000 * r['cpu_s']['stub_llm'] / max(1, r['completed']):.0f} ms"),
        ("  controller", lambda r: f"{1000 * r['cpu_s']['controller'] / max(1, r['completed']):.0f} ms"),
        (
            "  agents + calculators (+ worker)",
            lambda r: f"{1000 * r['cpu_s']['controller_children'] / max(1, r['completed']):.0f} ms",
        ),
        ("    of which agent processes (+ launchers)", lambda r: _per(r, "agents")),
        ("    of which calculator processes", lambda r: _per(r, "calculators")),
        ("CPU cores busy", lambda r: f"{r['cpu_cores_busy']:.2f}"),
        ("peak RSS sum / PSS sum (all processes)", lambda r: f"{r['peak_rss_mb']:.0f} MB / {r['peak_pss_mb']:.0f} MB"),
        ("peak processes", lambda r: str(r["peak_processes"])),
        ("stack start / warm-up", lambda r: f"{r['startup_s']:.1f} s / {r['warmup_s']:.1f} s"),
    ]
    head = "| | " + " | ".join(r["mode"] for r in results) + " |"
    sep = "|---|" + "---|" * len(results)
    body = [f"| {label} | " + " | ".join(fn(r) for r in results) + " |" for label, fn in rows]
    return "\n".join([head, sep, *body])


def where_time_goes(results: list[dict[str, Any]]) -> str:
    """A few sentences from the figures: what bounds throughput and what one rollout costs."""
    lines = ["Where the time goes:", ""]
    for r in results:
        n = max(1, r["completed"])
        cpu = r["cpu_s"]
        parts = [
            f"server {1000 * cpu['server'] / n:.0f} ms",
            f"stub LLM {1000 * cpu['stub_llm'] / n:.0f} ms",
            f"controller {1000 * cpu['controller'] / n:.0f} ms",
        ]
        if "agents" in cpu:
            parts += [
                f"agent process {1000 * cpu['agents'] / n:.0f} ms",
                f"calculator {1000 * cpu['calculators'] / n:.0f} ms",
            ]
        else:
            parts.append(f"agent + calculator processes {1000 * cpu['controller_children'] / n:.0f} ms")
        ceiling = (os.cpu_count() or 1) / max(r["cpu_ms_per_rollout"] / 1000, 1e-9)
        lines.append(
            f"- {r['mode']}: {r['cpu_ms_per_rollout']:.0f} ms of CPU per rollout ({', '.join(parts)}), so "
            f"{os.cpu_count()} idle cores could finish at most {ceiling:.1f} rollouts/s; the run reached "
            f"{r['rollouts_per_s']:.2f}/s with {r['cpu_cores_busy']:.2f} cores busy with it (the rest of the "
            f"machine was shared). An agent spent {r['agent_p50_s']:.2f} s (p50) in its process, mostly waiting "
            f"for CPU and for model calls; the controller added {r['overhead_p50_ms']:.0f} ms (p50)."
        )
    return "\n".join(lines)


def write_results(path: Path, results: list[dict[str, Any]], command: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    loads = ", ".join(f"{r['mode']} {r['load_before']:.1f}" for r in results if "load_before" in r) or "not recorded"
    text = f"""# Benchmark results

## Rollout throughput (`benchmarks/rollout_throughput.py`)

Measured {stamp} on this machine ({os.cpu_count()} CPU cores, shared with other work; load
average when each mode started: {loads}). Command:

```
{command}
```

{table(results)}

{where_time_goes(results)}

Overhead = time the attempt was RUNNING (claim to finish, server clock) minus the time the
runner measured inside the agent process. CPU is summed over the server, stub LLM, controller,
pre-forked worker, agents, calculators and launchers during the measured batch (after
warm-up). RSS sums double-count pages shared copy-on-write with the worker; PSS splits them.
"""
    previous = path.read_text() if path.exists() else ""
    marker = "## Rollout throughput"
    others = ""
    if previous and marker in previous:
        # keep sections other parts wrote
        before, _, after = previous.partition(marker)
        rest = after.split("\n## ", 1)
        others = (
            before.replace("# Benchmark results", "").strip() + ("\n\n## " + rest[1] if len(rest) > 1 else "")
        ).strip()
    elif previous:
        others = previous.replace("# Benchmark results", "").strip()
    path.write_text(text + ("\n" + others + "\n" if others else ""))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=256, help="rollouts in the measured batch (pre-forked mode)")
    p.add_argument(
        "--concurrency",
        type=int,
        default=default_concurrency(),
        help="controller --concurrency (default: the controller's own)",
    )
    p.add_argument(
        "--compare-n",
        type=int,
        default=32,
        help="rollouts for the --no-prefork comparison (0 skips it; it costs ~2 CPU-s per rollout)",
    )
    p.add_argument("--no-prefork-only", action="store_true", help="measure only the plain-spawn mode")
    p.add_argument("--warmup", type=int, default=8, help="rollouts run before measuring (module learning, pools)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--timeout-s", type=float, default=900.0)
    p.add_argument("--workdir", default=None, help="keep logs here (default: a temporary directory)")
    p.add_argument("--json", action="store_true", help="print the results as JSON too")
    p.add_argument("--write-results", action="store_true", help="update benchmarks/RESULTS.md")
    p.add_argument("--from-json", default=None, help=argparse.SUPPRESS)  # re-render saved --json output
    args = p.parse_args(argv)
    base = Path(args.workdir) if args.workdir else Path(tempfile.gettempdir())
    workdir = Path(tempfile.mkdtemp(prefix="calcx-bench-", dir=base))  # a fresh database every run
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: every process gets stopped
    modes = []
    if not args.no_prefork_only:
        modes.append(("prefork", True, args.n))
    if args.compare_n > 0 or args.no_prefork_only:
        modes.append(("no-prefork", False, args.compare_n or args.n))
    results = []
    if args.from_json:
        text = Path(args.from_json).read_text()
        results = json.loads(text[text.index("[") :])
        modes = []
    for name, prefork, n in modes:
        print(f"== {name}: {n} rollouts, concurrency {args.concurrency} (logs in {workdir / name})", file=sys.stderr)
        res = run_mode(name, prefork, n, args.warmup, args.concurrency, args.seed, workdir, args.timeout_s)
        print(
            f"   {res['rollouts_per_s']:.2f} rollouts/s, overhead p50 {res['overhead_p50_ms']:.1f} ms", file=sys.stderr
        )
        results.append(res)
    print(table(results))
    if args.json:
        print(json.dumps(results, indent=2))
    if args.write_results:
        given = list(argv if argv is not None else sys.argv[1:])
        if args.from_json:  # the command that measured them, not the one that re-rendered them
            given = ["--n", str(args.n), "--concurrency", str(args.concurrency), "--compare-n", str(args.compare_n)]
        cmd = "PYTHONPATH=src/python /opt/calcx-dev/bin/python benchmarks/rollout_throughput.py " + " ".join(
            a for a in given if a != "--json"
        )
        write_results(ROOT / "benchmarks" / "RESULTS.md", results, cmd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
