"""A fault run: the whole loop as real processes on loopback (server, stub LLM behind the fault
proxy, controller, real agents and calculators), the planned rows submitted at once while the
injector, a hostile client and a hang watch act on it, and the audit at the end; and a run
with many rollouts queued at once (server memory and latency, then a drain)."""

from __future__ import annotations

import argparse
import math
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from calcx.common.stats import percentile
from calcx.contract.failures import FailureReason
from calcx.faults.audit import HangWatch, all_rollouts, audit, recovery_times
from calcx.faults.forensics import agent_rewards, started_lines
from calcx.faults.hostile import (
    CANARY_NAME,
    KEY,
    LEASE_HOLDER,
    LEASED_RUN,
    MAX_BODY_BYTES,
    MAX_EVENT_BODY_BYTES,
    MAX_EVENTS_PER_ATTEMPT,
    AttemptRef,
    HostileClient,
    _auth,
    _j,
    ref_of,
)
from calcx.faults.injector import Injector
from calcx.faults.plan import DEFAULT_SCHEDULE, REFUSED_AT_CREATE, build_plan, should_retry
from calcx.procs.procutil import pid_alive, rss_bytes


def make_stack(
    workdir: Path,
    plan_script: Path,
    rows_script: Path,
    concurrency: int,
    lease_s: float,
    upstream_timeout_s: float,
    calculator_timeout_s: float,
    agent_timeout_s: float,
) -> Any:
    from calcx.rehearse.stack import Stack, StackConfig

    config = StackConfig(
        workdir=workdir,
        key=KEY,
        concurrency=concurrency,
        agent_logs=True,
        script_files=[str(rows_script), str(plan_script)],
        server_args=[
            "--lease-s",
            str(lease_s),
            "--max-body-bytes",
            str(MAX_BODY_BYTES),
            "--max-event-body-bytes",
            str(MAX_EVENT_BODY_BYTES),
            "--max-events-per-attempt",
            str(MAX_EVENTS_PER_ATTEMPT),
            "--upstream-timeout-s",
            str(upstream_timeout_s),
            "--upstream-retries",
            "2",
        ],
        controller_env={
            "CALCX_CALCULATOR_TIMEOUT_S": str(calculator_timeout_s),
            "CALCX_AGENT_TIMEOUT_S": str(agent_timeout_s),
        },
    )
    return Stack(config)


def start_proxy(stack: Any, canary: Path) -> Any:
    from calcx.procs.managed import ManagedProcess
    from calcx.rehearse.stack import python_env

    cmd = [stack.config.python, "-m", "calcx.faults.proxy", "--upstream", stack.stub_url, "--canary", str(canary)]
    proc = ManagedProcess("fault-proxy", cmd, stack.workdir / "proxy.log", python_env())
    proc.start(re.compile(r"serving on (http://\S+)"), 60)
    return proc


class DecoyKeeper(threading.Thread):
    """Heartbeats the hostile client's RUNNING decoy so that its lease never lapses."""

    def __init__(self, base_url: Callable[[], str], key: str, decoy: AttemptRef, period_s: float = 1.0) -> None:
        super().__init__(name="decoy-keeper", daemon=True)
        self.base_url, self.key, self.decoy, self.period_s = base_url, key, decoy, period_s
        self._halt = threading.Event()

    def run(self) -> None:
        from calcx.api.client import CalcxAPIError, CalcxClient

        while not self._halt.wait(self.period_s):
            try:
                with CalcxClient(self.base_url(), self.key, timeout=10) as c:
                    c.heartbeat("hostile-client", [self.decoy[:2]])
            except CalcxAPIError:
                pass

    def stop(self) -> None:
        self._halt.set()
        self.join(15)


def decoy_attempts(client: Any, prefix: str) -> tuple[AttemptRef, AttemptRef]:
    """Two rollouts the hostile client owns (claimed before any controller runs): one kept
    RUNNING, one finished FAILED. One attempt each: should the decoy's lease ever lapse, no
    controller may claim it again and run an agent for it. And a run lease held by another
    trainer, whose run the hostile client writes for."""
    row = {"question": "decoy", "result": "0"}
    client.create_rollouts(
        [
            {"rollout_id": f"{prefix}-decoy-{name}", "row": row, "deadline_s": 3600, "max_attempts": 1}
            for name in ("running", "finished")
        ]
    )
    claims = client.claim("hostile-client", max=2, timeout_s=0).claims
    refs = {c.rollout.rollout_id: ref_of(c.rollout) for c in claims}
    running, finished = refs[f"{prefix}-decoy-running"], refs[f"{prefix}-decoy-finished"]
    assert running is not None and finished is not None, "a claimed attempt has its token nonce"
    client.finish(*finished[:2], "FAILED", reason=FailureReason.CANCELLED, detail="decoy of the hostile client")
    client.acquire_lease(LEASED_RUN, LEASE_HOLDER)  # another trainer's run (its writes are fenced by owner id)
    return running, finished


def submit(client: Any, plan: Any) -> dict[str, tuple[str, str]]:
    """Create the plan's rollouts in one batch, except those the server must refuse: each of those
    is sent alone and its answer recorded (rid -> (kind, outcome)); they leave the plan."""
    from calcx.api.client import CalcxAPIError

    refused = [spec for spec in plan.specs if plan.kind[spec["rollout_id"]] in REFUSED_AT_CREATE]
    plan.specs[:] = [spec for spec in plan.specs if spec not in refused]
    client.create_rollouts(plan.specs)
    outcomes: dict[str, tuple[str, str]] = {}
    for spec in refused:
        rid = spec["rollout_id"]
        try:
            client.create_rollouts([spec])
            outcome = "CREATED"
        except CalcxAPIError as exc:
            outcome = f"REFUSED {exc.status}"
        outcomes[rid] = (plan.kind.pop(rid), outcome)
        plan.questions.pop(rid, None)
    return outcomes


def run_faults(args: argparse.Namespace, workdir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    from calcx.api.client import CalcxAPIError, CalcxClient

    plan = build_plan(
        args.n, workdir, deadline_s=args.deadline_s, kinds_each=args.kinds_each, kinds=getattr(args, "kinds", None)
    )
    canary = workdir / CANARY_NAME
    stack = make_stack(
        workdir,
        plan.script,
        workdir / "rows.jsonl",
        args.concurrency,
        args.lease_s,
        args.upstream_timeout_s,
        args.calculator_timeout_s,
        args.agent_timeout_s,
    )
    result: dict[str, Any] = {}
    proxy = None
    threads: list[Any] = []
    t_start = time.time()
    try:
        stack.start_server()
        stack.start_stub()
        proxy = start_proxy(stack, canary)
        assert proxy.match is not None
        with CalcxClient(stack.server_url, KEY) as c:
            c.put_models(stack.config.model_name, [proxy.match.group(1)])
            decoy, finished = decoy_attempts(c, "f")
        keeper = DecoyKeeper(lambda: stack.server_url, KEY, decoy)
        keeper.start()
        threads.append(keeper)
        stack.start_controller(controller_id="faults-main")
        log(f"stack up in {time.time() - t_start:.1f}s: server {stack.server_url}")

        def client() -> CalcxClient:
            return CalcxClient(stack.server_url, KEY, timeout=30)

        progress_state: dict[str, Any] = {"terminal": 0, "running": [], "finished": []}

        def progress() -> float:
            return progress_state["terminal"] / len(plan.specs)

        def live() -> tuple[list[AttemptRef], list[AttemptRef]]:
            return progress_state["running"], progress_state["finished"]

        hostile = HostileClient(lambda: stack.server_url, KEY, decoy, finished, live)
        hang = HangWatch(client)
        schedule = getattr(args, "schedule", None) or DEFAULT_SCHEDULE
        injector = Injector(stack, plan, progress, schedule, log)
        threads += [hostile, hang, injector]

        with client() as c:
            refusals = submit(c, plan)
        t_submit = time.time()
        log(f"submitted {len(plan.specs)} rollouts")
        for t in (hostile, hang, injector):
            t.start()
        # Drive: keep the decoy alive, retry collateral infra failures of clean rows (a trainer's
        # job), stop when every rollout is terminal and no retry is pending.
        retried: Counter[str] = Counter()
        deadline = time.monotonic() + args.timeout_s
        last_report = 0.0
        while time.monotonic() < deadline:
            try:
                with client() as c:
                    rollouts = all_rollouts(c, "f")
                    mine = [r for r in rollouts if r.rollout_id in plan.kind]
                    terminal = [r for r in mine if r.is_terminal]
                    progress_state["terminal"] = len(terminal)
                    progress_state["running"] = [ref for r in mine if r.state == "RUNNING" and (ref := ref_of(r))]
                    progress_state["finished"] = [ref for r in terminal if (ref := ref_of(r))]
                    for r in terminal:
                        if should_retry(plan.kind[r.rollout_id], r):
                            c.retry(r.rollout_id)
                            retried[r.attempts[-1].reason or "?"] += 1
                    done = len(terminal) == len(mine) == len(plan.specs) and not any(
                        should_retry(plan.kind[r.rollout_id], r) for r in terminal
                    )
            except CalcxAPIError:
                time.sleep(0.2)  # the server is restarting
                continue
            if time.monotonic() - last_report > 10:
                last_report = time.monotonic()
                log(
                    f"  {len(terminal)}/{len(plan.specs)} terminal, {len(progress_state['running'])} running, "
                    f"{sum(retried.values())} retried"
                )
            if done and not injector.schedule_left() and not injector.busy():
                break
            time.sleep(0.5)
        t_end = time.time()
        for t in threads:
            t.stop()
        with client() as c:
            rollouts = all_rollouts(c, "f")
            calls = lambda rid, aid: c.calls(rid, attempt_id=aid)  # noqa: E731
            posted = agent_rewards(sorted(workdir.glob("agents-*")))
            starts = started_lines(sorted(workdir.glob("controller-*.log")))
            report = audit(rollouts, plan.kind, starts, posted, plan.questions, calls)
            for kind, outcome in refusals.values():
                report["planned_outcomes"].setdefault(kind, {})
                report["planned_outcomes"][kind][outcome] = report["planned_outcomes"][kind].get(outcome, 0) + 1
        attempts = [(a.controller_id, a) for r in rollouts for a in r.attempts]
        result = {
            "audit": report,
            "retried": dict(retried),
            "hostile": hostile.summary(injector.server_down()),
            "hangs": sorted(hang.hung),
            "events": [ev.__dict__ for ev in injector.events],
            "injector_errors": injector.errors,
            "orphans": injector.orphans,
            "recovery": recovery_times(injector.events, attempts),
            "canary_exists": canary.exists() or any(Path("/tmp").glob("calcx-*-pwned")),
            "wall_s": t_end - t_submit,
            "agent_rewards_seen": len(posted),
        }
    finally:
        for t in threads:
            if t.is_alive():
                try:
                    t.stop()
                except Exception:
                    pass
        leftover_before = stack.all_pids()
        stack.stop()
        if proxy is not None:
            proxy.stop()
        time.sleep(0.5)
        result["leftover_processes"] = sorted(p for p in leftover_before if pid_alive(p))
    return result


def run_queued(args: argparse.Namespace, workdir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """N rollouts queued at once with no controller: server memory and latency, then a drain."""
    from calcx.api.client import CalcxClient
    from calcx.data.generator import generate_split
    from calcx.data.io import write_jsonl

    n = args.queued
    rows = generate_split("train", n, seed=3)
    write_jsonl(rows, workdir / "rows.jsonl")
    (workdir / "empty.jsonl").write_text("")
    stack = make_stack(
        workdir, workdir / "empty.jsonl", workdir / "rows.jsonl", args.concurrency, 30.0, 30.0, 30.0, 60.0
    )
    out: dict[str, Any] = {"queued": n}
    try:
        stack.start_server()
        stack.start_stub()
        stack.register_model()
        http = httpx.Client(base_url=stack.server_url, headers=_auth(KEY), timeout=60)

        def timed(method: str, path: str, body: Any = None) -> tuple[float, httpx.Response]:
            t = time.perf_counter()
            resp = http.request(method, path, content=None if body is None else _j(body))
            return time.perf_counter() - t, resp

        def latencies(count: int, method: str, path: Callable[[int], str], body: Any = None) -> list[float]:
            out_l = []
            for i in range(count):
                dt, resp = timed(method, path(i), body)
                if resp.status_code >= 400:
                    raise RuntimeError(f"{method} {path(i)}: {resp.status_code} {resp.text[:200]}")
                out_l.append(dt)
            return out_l

        rss0 = rss_bytes(stack.server.pid)
        base_health = latencies(200, "GET", lambda i: "/healthz")
        specs = [
            {"rollout_id": f"q-{i:05d}", "group_id": f"q-g{i // 8}", "row": row, "deadline_s": 60, "max_attempts": 1}
            for i, row in enumerate(rows)
        ]
        dt_create, resp = timed("POST", "/v1/rollouts", {"rollouts": specs})
        if resp.status_code != 200:
            raise RuntimeError(f"create: {resp.status_code} {resp.text[:300]}")
        rss1 = rss_bytes(stack.server.pid)
        health = latencies(300, "GET", lambda i: "/healthz")
        gets = latencies(300, "GET", lambda i: f"/v1/rollouts/q-{(i * 37) % n:05d}")
        lists = latencies(20, "GET", lambda i: "/v1/rollouts?state=QUEUED&limit=1000")
        claims = latencies(
            100, "POST", lambda i: "/v1/claims", {"controller_id": "latency-probe", "max": 1, "timeout_s": 0}
        )
        with CalcxClient(stack.server_url, KEY) as c:
            for r in c.list_rollouts(state="RUNNING", controller_id="latency-probe", limit=1000):
                c.finish(
                    r.rollout_id,
                    r.attempts[-1].attempt_id,
                    "FAILED",
                    reason=FailureReason.CANCELLED,
                    detail="claimed only to measure claim latency",
                )
        rss2 = rss_bytes(stack.server.pid)
        log(f"queued {n}: create {dt_create * 1000:.0f} ms; draining for {args.drain_s:.0f}s")
        stack.start_controller(controller_id="drain")
        t_drain = time.time()
        drain_health: list[float] = []
        while time.time() - t_drain < args.drain_s:
            drain_health.append(timed("GET", "/healthz")[0])
            time.sleep(0.1)
        drain_gets = latencies(100, "GET", lambda i: f"/v1/rollouts/q-{(i * 53) % n:05d}")
        with CalcxClient(stack.server_url, KEY) as c:
            done = all_rollouts(c, "q")
        rss3 = rss_bytes(stack.server.pid)
        states = Counter(r.state for r in done)
        ms = lambda xs, q: percentile(xs, q, math.nan) * 1000  # noqa: E731
        out.update(
            {
                "create_ms": dt_create * 1000,
                "rss_mb": {
                    "idle": rss0 / 2**20,
                    "after_enqueue": rss1 / 2**20,
                    "after_probes": rss2 / 2**20,
                    "after_drain": rss3 / 2**20,
                },
                "latency_ms": {
                    "healthz idle": (ms(base_health, 0.5), ms(base_health, 0.99)),
                    "healthz, 1,000 queued": (ms(health, 0.5), ms(health, 0.99)),
                    "GET rollout, 1,000 queued": (ms(gets, 0.5), ms(gets, 0.99)),
                    "list 1,000 QUEUED": (ms(lists, 0.5), ms(lists, 0.99)),
                    "claim (max=1)": (ms(claims, 0.5), ms(claims, 0.99)),
                    "healthz while draining": (ms(drain_health, 0.5), ms(drain_health, 0.99)),
                    "GET rollout while draining": (ms(drain_gets, 0.5), ms(drain_gets, 0.99)),
                },
                "drain_s": args.drain_s,
                "states_after_drain": dict(states),
                "lost": n - len(done),
            }
        )
    finally:
        stack.stop()
    return out
