"""Several model replicas behind one gateway, all real processes on loopback: `calcx server` and
two or three `calcx stub-llm`s registered as its endpoints. Each rollout's calls go to one replica,
new rollouts to the least-loaded one, and a replica that stops gets no new rollout until it
answers again."""

from __future__ import annotations

import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from calcx.api.client import CalcxClient
from calcx.api.tokens import new_key
from calcx.contract.env import CALCX_KEY
from calcx.contract.ready import SERVER_READY, STUB_LLM_READY
from calcx.procs.managed import ManagedProcess, ProcessStartError
from calcx.rehearse.stack import python_env, services_env


def turn(n: int) -> dict[str, object]:
    """A rollout's call `n`: its conversation grows by a turn each call (a call equal to an
    earlier one of the attempt would be taken for the agent sending it again)."""
    messages: list[dict[str, str]] = []
    for k in range(n + 1):
        messages += [{"role": "user", "content": f"What is {k} + 2?"}, {"role": "assistant", "content": f"{k + 2}"}]
    return {"model": "m", "messages": messages[:-1]}


class Stack:
    """The server and its stub replicas; every process is stopped by pid at the end."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.key = new_key()
        self.procs: list[ManagedProcess] = []
        cmd = [
            sys.executable,
            "-m",
            "calcx.server",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--db",
            str(workdir / "calcx.db"),
            "--log-level",
            "warning",
            "--replica-probe-s",
            "0.2",
        ]
        server = self._start("server", cmd, services_env({CALCX_KEY: self.key}), SERVER_READY)
        assert server.match is not None
        self.url = server.match.group(1)

    def stub(self, name: str, *args: str, port: int = 0) -> tuple[ManagedProcess, str]:
        cmd = [
            sys.executable,
            "-m",
            "calcx.stub_llm",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
            *args,
        ]
        proc = self._start(name, cmd, python_env(), STUB_LLM_READY)
        assert proc.match is not None
        return proc, proc.match.group(1).rstrip("/")

    def client(self) -> CalcxClient:
        return CalcxClient(self.url, self.key, timeout=60.0)

    def _start(self, name: str, cmd: list[str], env: dict[str, str], ready: re.Pattern[str]) -> ManagedProcess:
        proc = ManagedProcess(name, cmd, self.workdir / f"{name}-{len(self.procs)}.log", env)
        self.procs.append(proc)
        return proc.start(ready, timeout_s=60)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.alive():
                proc.stop()


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path)
    try:
        yield s
    finally:
        s.stop()


def claimed(client: CalcxClient, ids: list[str]) -> dict[str, str]:
    """The rollouts created and claimed: rollout id -> attempt id."""
    client.create_rollouts([{"rollout_id": rid, "row": {"question": "q", "result": "4"}} for rid in ids])
    claims = client.claim("ctl", len(ids), timeout_s=5).claims
    assert len(claims) == len(ids)
    return {c.rollout.rollout_id: c.attempt_id for c in claims}


def endpoints_of(client: CalcxClient, rid: str) -> list[str | None]:
    return [c.endpoint for c in client.calls(rid)]


def metric(client: CalcxClient, name: str) -> dict[str, float]:
    """One labelled-by-endpoint metric of the server's /metrics: endpoint -> value."""
    for family in text_string_to_metric_families(client.metrics_text()):
        for sample in family.samples:
            if sample.name == name:
                return {s.labels["endpoint"]: s.value for s in family.samples if s.name == name}
    return {}


def stub_requests(url: str) -> int:
    """Chat completions a stub answered, by its own count."""
    return sum(httpx.get(url.removesuffix("/v1") + "/stub/stats", timeout=10).json()["counts"].values())


def run_rollouts(stack: Stack, ids: list[str], calls: int, workers: int, first_together: bool = False) -> None:
    """Each rollout makes `calls` calls one after another, then finishes; `workers` rollouts run
    at once. With `first_together`, every rollout's first call is sent at the same moment."""
    with stack.client() as client:
        attempts = claimed(client, ids)
    barrier = threading.Barrier(len(ids)) if first_together else None

    def rollout(rid: str) -> None:
        with stack.client() as client:
            for n in range(calls):
                if n == 0 and barrier is not None:
                    barrier.wait(60)
                client.chat_completions(rid, attempts[rid], turn(n))
            client.finish(rid, attempts[rid], "SUCCEEDED")

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(rollout, ids))


def test_rollouts_of_one_moment_spread_evenly_and_each_stays_on_its_replica(stack: Stack) -> None:
    """Nine rollouts start at once on three equally fast replicas (0.5 s a call, so every first
    call is in flight when the next is placed): three each, every call of a rollout on one."""
    urls = [stack.stub(f"stub-{i}", "--mode", "slow", "--slow-s", "0.5")[1] for i in range(3)]
    ids = [f"even-{i}" for i in range(9)]
    with stack.client() as client:
        client.put_models("m", urls)
        run_rollouts(stack, ids, calls=3, workers=len(ids), first_together=True)
        recorded = {rid: endpoints_of(client, rid) for rid in ids}
        assert all(len(r) == 3 for r in recorded.values()), recorded
        homes = {rid: set(r) for rid, r in recorded.items()}
        assert all(len(h) == 1 for h in homes.values()), homes
        per_replica = Counter(next(iter(h)) for h in homes.values())
        assert sorted(per_replica.values()) == [3, 3, 3], per_replica
        assert metric(client, "calcx_gateway_replica_calls_total") == {u: 9.0 for u in urls}
        assert [stub_requests(u) for u in urls] == [9, 9, 9]  # as each replica counted them itself
        assert metric(client, "calcx_gateway_replica_rollouts") == {u: 0.0 for u in urls}  # all ended


def test_a_slow_replica_gets_fewer_rollouts(stack: Stack) -> None:
    """The slow replica is first in the registry, so it would win every tie; its calls in flight
    keep new rollouts away from it."""
    slow = stack.stub("slow", "--mode", "slow", "--slow-s", "0.5")[1]
    fast = [stack.stub(f"fast-{i}")[1] for i in range(2)]
    ids = [f"slow-{i}" for i in range(12)]
    with stack.client() as client:
        client.put_models("m", [slow, *fast])
        run_rollouts(stack, ids, calls=3, workers=4)
        recorded = {rid: endpoints_of(client, rid) for rid in ids}
        assert all(len(r) == 3 for r in recorded.values()), recorded
        homes = {rid: set(r) for rid, r in recorded.items()}
        assert all(len(h) == 1 for h in homes.values()), homes
        per_replica = Counter(next(iter(h)) for h in homes.values())
        assert per_replica[slow] * 3 < len(ids), (slow, per_replica)  # less than an even share


def _until(check: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not {what} after {timeout_s:.0f} s")
        time.sleep(0.1)


def test_a_stopped_replica_loses_its_rollouts_and_gets_new_ones_only_once_it_answers(stack: Stack) -> None:
    first, a = stack.stub("a")
    b = stack.stub("b")[1]
    with stack.client() as client:
        client.put_models("m", [a, b])
        attempts = claimed(client, ["r0", "r1"])
        made: Counter[str] = Counter()

        def call(rid: str) -> None:
            client.chat_completions(rid, attempts[rid], turn(made[rid]))
            made[rid] += 1

        for rid in ("r0", "r1"):
            call(rid)
        assert (endpoints_of(client, "r0"), endpoints_of(client, "r1")) == ([a], [b])

        first.stop()
        call("r0")  # A refuses the connection: B answers
        assert endpoints_of(client, "r0") == [a, b]
        assert metric(client, "calcx_gateway_replica_up") == {a: 0.0, b: 1.0}
        attempts |= claimed(client, ["r2", "r3"])
        for rid in ("r2", "r3", "r0"):
            call(rid)
        # A has no rollout and no call in flight, yet nothing is placed on it while it is down
        assert (endpoints_of(client, "r2"), endpoints_of(client, "r3")) == ([b], [b])
        assert endpoints_of(client, "r0") == [a, b, b]  # moved for good

        port = a.rsplit(":", 1)[1].split("/")[0]
        _restart(stack, "a-again", port)
        _until(lambda: metric(client, "calcx_gateway_replica_up").get(a) == 1.0, "probed up")
        attempts |= claimed(client, ["r4"])
        for rid in ("r4", "r0"):
            call(rid)
        assert endpoints_of(client, "r4") == [a]  # the least loaded again, once it answered
        assert endpoints_of(client, "r0") == [a, b, b, b]  # a rollout stays where it moved


def _restart(stack: Stack, name: str, port: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            stack.stub(name, port=int(port))
            return
        except ProcessStartError:  # the port may linger for a moment
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
