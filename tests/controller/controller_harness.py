"""Helpers of the controller tests: a real stack (server, stub LLM, controllers) and ways to
find the processes a rollout started."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from calcx.api.client import CalcxClient
from calcx.api.models import Claim, Rollout
from calcx.data.generator import generate_split
from calcx.data.io import write_jsonl
from calcx.procs.managed import ManagedProcess
from calcx.procs.procutil import descendants, pid_alive, process_name
from calcx.rehearse.stack import Stack, StackConfig

KEY = "controller-test-key-0123456789-abc"


def make_stack(workdir: Path, rows: int = 16, concurrency: int = 4, **kw: Any) -> tuple[Stack, list[dict[str, Any]]]:
    data = generate_split("train", rows, seed=11)
    path = workdir / "rows.jsonl"
    write_jsonl(data, path)
    # A calculator killed in the middle of a request is noticed by the agent's request timeout:
    # keep it short so that the test of calculator death stays bounded on a busy machine.
    kw.setdefault("controller_env", {"CALCX_CALCULATOR_TIMEOUT_S": "15"})
    config = StackConfig(
        workdir=workdir,
        key=KEY,
        concurrency=concurrency,
        script_files=[str(path)],
        server_args=["--lease-s", "10"],
        **kw,
    )
    return Stack(config), data


def claim(env: dict[str, str] | None = None, deadline_s: float = 30.0, rid: str = "r1") -> Claim:
    """A claim of rollout `rid`, for a runner driven without a server."""
    rollout = Rollout(
        rollout_id=rid, row={"question": "q", "result": "1"}, state="RUNNING", attempts=[], created_at=time.time()
    )
    return Claim(rollout=rollout, attempt_id="1", token="t", env=env or {}, deadline_s=deadline_s)


def client_of(stack: Stack) -> CalcxClient:
    return CalcxClient(stack.server_url, KEY, timeout=60)


def spec(
    rid: str, row: dict[str, Any], *, deadline_s: float = 60.0, marker: str | None = None, group: str | None = None
) -> dict[str, Any]:
    """A rollout of `row`; a `[stub:...]` marker in the question picks the stub's behaviour."""
    row = dict(row)
    if marker:
        row["question"] = f"{row['question']} [stub:{marker}]"
    return {"rollout_id": rid, "group_id": group, "row": row, "deadline_s": deadline_s, "max_attempts": 1}


def wait_terminal(client: CalcxClient, ids: Iterable[str], timeout_s: float = 60.0) -> dict[str, Rollout]:
    deadline = time.monotonic() + timeout_s
    out: dict[str, Rollout] = {}
    for rid in ids:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"rollout {rid} not terminal after {timeout_s}s: {client.get_rollout(rid).state}")
            rollout = client.wait(rid, timeout_s=min(10.0, remaining))
            if rollout.is_terminal:
                out[rid] = rollout
                break
    return out


def started_pid(controller: ManagedProcess, rid: str, timeout_s: float = 30.0) -> int:
    """The agent pid the controller logged for attempt 1 of `rid`."""
    pattern = re.compile(rf"started {re.escape(rid)}/1 pid (\d+)")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        match = pattern.search(Path(controller.log_path).read_text(errors="replace"))
        if match:
            return int(match.group(1))
        time.sleep(0.05)
    raise AssertionError(f"{controller.name} never logged the start of {rid}")


def rollout_processes(controller: ManagedProcess, before: set[int]) -> dict[int, str]:
    """Processes below the controller that appeared since `before`, except the worker's spares."""
    now = descendants(controller.pid) - before
    named = {pid: process_name(pid) or "?" for pid in now}
    # The worker's spares outlive rollouts; a spare forked a moment ago still carries its parent's
    # name (calcx-zygote) until it renames itself, so both names are workers, not rollout processes.
    return {pid: name for pid, name in named.items() if name not in ("calcx-spare", "calcx-zygote")}


def wait_for_name(controller: ManagedProcess, before: set[int], name: str, timeout_s: float = 20.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for pid, found in rollout_processes(controller, before).items():
            if found == name:
                return pid
        time.sleep(0.05)
    raise AssertionError(f"no {name} process appeared below {controller.name}")


def wait_gone(pids: Iterable[int], timeout_s: float = 10.0) -> list[int]:
    """Wait for `pids` to end; returns those still alive at the deadline."""
    pids = list(pids)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = [p for p in pids if pid_alive(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return [p for p in pids if pid_alive(p)]
