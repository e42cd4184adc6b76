"""A trainer killed mid-run, and the same run started again.

The doomed trainer is a real process (`python -m calcx.faults.killed_trainer`): like `calcx
train` it labels its rollouts with its run's name, creates them, and waits on them; it is
SIGKILLed while some run and others are queued, with the server and controller living on. The
restarted run first cancels what its predecessor left (`POST /v1/cancel` with the run, what
`calcx.trainer.rollouts.leftovers` does), then creates and drives its own rollouts. Checked: nothing lost
(every rollout of both runs terminal), no leftover attempt started after the cancel (the old
queue does not run first, nothing of the dead run is run or trained again), the controller
stopped the leftover running attempts (FAILED `cancelled_by_api`), and the new run's rollouts each ran
once and SUCCEEDED.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from calcx.contract.env import CALCX_KEY

RUN = "faults-killed-trainer"
SLOW = "[stub:slow=3]"  # each model turn takes 3 s: the old run's work is still there when it dies


def _specs(prefix: str, rows: list[dict[str, Any]], deadline_s: float) -> list[dict[str, Any]]:
    from calcx.contract.labels import RUN_LABEL, STEP_LABEL

    return [
        {
            "rollout_id": f"{prefix}-{i:03d}",
            "group_id": f"{prefix}-g{i // 2}",
            "row": {**row, "question": f"{row['question']} {SLOW}"},
            "deadline_s": deadline_s,
            "max_attempts": 1,
            "labels": {RUN_LABEL: RUN, STEP_LABEL: "1"},
        }
        for i, row in enumerate(rows)
    ]


def trainer_main(argv: list[str] | None = None) -> int:
    """The doomed trainer: create the rollouts, say so, then wait on them until killed."""
    from calcx.api.client import CalcxClient
    from calcx.data.io import read_jsonl

    p = argparse.ArgumentParser(prog="python -m calcx.faults.killed_trainer")
    p.add_argument("--server", required=True)
    p.add_argument("--rows", required=True)
    p.add_argument("--deadline-s", type=float, default=60.0)
    args = p.parse_args(argv)
    rows = list(read_jsonl(args.rows))
    key = os.environ[CALCX_KEY]  # from its environment: a command line is readable by every process
    with CalcxClient(args.server, key, timeout=60) as client:
        specs = _specs("kt-old", rows, args.deadline_s)
        client.create_rollouts(specs)
        print(f"created {len(specs)} rollouts", flush=True)
        for spec in specs:
            client.wait(spec["rollout_id"], timeout_s=30)
    return 0


def run_killed_trainer(
    stack: Any,
    workdir: Path,
    rows: list[dict[str, Any]],
    log: Callable[[str], None],
    deadline_s: float = 60.0,
    timeout_s: float = 180.0,
) -> dict[str, Any]:
    """Kill a trainer with rollouts running and queued, restart its run; what became of both.
    `stack`: a started server, stub LLM (with `rows` scripted) and controller."""
    import re

    from calcx.api.client import CalcxClient
    from calcx.data.io import write_jsonl
    from calcx.procs.managed import ManagedProcess
    from calcx.rehearse.stack import python_env

    half = len(rows) // 2
    old_rows, new_rows = rows[:half], rows[half:]
    write_jsonl(old_rows, workdir / "killed-trainer-rows.jsonl")
    trainer = ManagedProcess(
        "doomed-trainer",
        [
            stack.config.python,
            "-m",
            "calcx.faults.killed_trainer",
            "--server",
            stack.server_url,
            "--rows",
            str(workdir / "killed-trainer-rows.jsonl"),
            "--deadline-s",
            str(deadline_s),
        ],
        workdir / "doomed-trainer.log",
        python_env({CALCX_KEY: stack.config.key}),
    )
    trainer.start(re.compile(r"created (\d+) rollouts"), 60)
    out: dict[str, Any] = {}
    with CalcxClient(stack.server_url, stack.config.key, timeout=30) as client:
        old_ids = [s["rollout_id"] for s in _specs("kt-old", old_rows, deadline_s)]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # some running, some still queued
            states = [client.get_rollout(rid).state for rid in old_ids]
            if "RUNNING" in states and "QUEUED" in states:
                break
            time.sleep(0.1)
        trainer.stop(grace_s=0, sig=signal.SIGKILL)
        at_kill = {rid: client.get_rollout(rid).state for rid in old_ids}
        log(
            f"trainer killed with {sum(s == 'RUNNING' for s in at_kill.values())} running, "
            f"{sum(s == 'QUEUED' for s in at_kill.values())} queued"
        )

        # the same run starts again: first its predecessor's leftovers, then its own work
        cancel_at = time.time()
        cancelled = client.cancel(run=RUN, detail="the run restarted after its trainer was killed")
        new_specs = _specs("kt-new", new_rows, deadline_s)
        client.create_rollouts(new_specs)
        new_ids = [s["rollout_id"] for s in new_specs]
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            rollouts = [client.get_rollout(rid) for rid in old_ids + new_ids]
            if all(r.is_terminal for r in rollouts) and not client.list_rollouts(state="RUNNING"):
                break
            time.sleep(0.5)
        old = [client.get_rollout(rid) for rid in old_ids]
        new = [client.get_rollout(rid) for rid in new_ids]
    out.update(
        {
            "at_kill": at_kill,
            "cancelled": sorted(ref.rollout_id for ref in cancelled),
            "lost": sorted(r.rollout_id for r in old + new if not r.is_terminal),
            # an attempt of the dead run that started after the cancel would be its work run (and
            # trained) again, ahead of or beside the new run's
            "old_started_after_cancel": sorted(
                r.rollout_id for r in old for a in r.attempts if a.started_at is not None and a.started_at > cancel_at
            ),
            "old_states": {r.rollout_id: (r.state, r.attempts[-1].reason) for r in old},
            "new_not_succeeded_once": sorted(
                r.rollout_id for r in new if r.state != "SUCCEEDED" or len(r.attempts) != 1
            ),
        }
    )
    return out


if __name__ == "__main__":
    sys.exit(trainer_main())


def run_killed(workdir: Path, log: Callable[[str], None], rows_n: int = 8) -> dict[str, Any]:
    """The killed-trainer scenario on its own stack (server, stub LLM, one controller of 2)."""
    from calcx.data.generator import generate_split
    from calcx.data.io import write_jsonl
    from calcx.faults.run import make_stack

    rows = generate_split("train", rows_n, seed=5)
    write_jsonl(rows, workdir / "rows.jsonl")
    (workdir / "empty.jsonl").write_text("")
    stack = make_stack(
        workdir,
        workdir / "empty.jsonl",
        workdir / "rows.jsonl",
        concurrency=2,
        lease_s=3.0,
        upstream_timeout_s=30.0,
        calculator_timeout_s=30.0,
        agent_timeout_s=60.0,
    )
    try:
        stack.start_server()
        stack.start_stub()
        stack.register_model()
        stack.start_controller(controller_id="killed-trainer")
        return run_killed_trainer(stack, workdir, rows, log)
    finally:
        stack.stop()


def render(res: dict[str, Any]) -> list[str]:
    """The benchmark report's section on this scenario."""
    at_kill = list(res["at_kill"].values())
    return [
        "## A trainer killed mid-run, its run started again",
        "",
        f"The trainer was SIGKILLed with {at_kill.count('RUNNING')} rollouts running and "
        f"{at_kill.count('QUEUED')} queued (server and controller living on). The restarted run cancelled "
        f"{len(res['cancelled'])}; leftover attempts started after the cancel: "
        f"{len(res['old_started_after_cancel'])}; new rollouts that did not succeed in one attempt: "
        f"{len(res['new_not_succeeded_once'])}; lost: {len(res['lost'])}.",
        "",
    ]


def problems(res: dict[str, Any]) -> bool:
    return bool(res["lost"] or res["old_started_after_cancel"] or res["new_not_succeeded_once"])
