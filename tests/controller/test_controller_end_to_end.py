"""The rollout loop end to end: real server, stub LLM, controllers with the local runner
(pre-forked workers), the real agent and the real MCP calculator."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from controller_harness import (
    client_of,
    make_stack,
    rollout_processes,
    spec,
    started_pid,
    wait_for_name,
    wait_gone,
    wait_terminal,
)

from calcx.procs.procutil import descendants, process_name
from calcx.rehearse.stack import Stack


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, list[dict]]]:
    stack, rows = make_stack(tmp_path_factory.mktemp("e2e"), rows=24, concurrency=4)
    stack.start()
    try:
        yield stack, rows
    finally:
        stack.stop()


def test_rollouts_succeed_with_rewards_and_recorded_token_ids(loop: tuple[Stack, list[dict]]) -> None:
    stack, rows = loop
    client = client_of(stack)
    client.create_rollouts(
        [spec(f"ok-{i}", rows[i], group="g-ok") for i in range(4)] + [spec("wrong-0", rows[4], marker="wrong")]
    )
    done = wait_terminal(client, [f"ok-{i}" for i in range(4)] + ["wrong-0"])
    for i in range(4):
        rollout = done[f"ok-{i}"]
        assert rollout.state == "SUCCEEDED", rollout.latest_attempt.detail
        assert rollout.reward == 1.0
        attempt = rollout.latest_attempt
        assert attempt.exit_code == 0 and attempt.agent_seconds is not None and attempt.agent_seconds > 0
        assert attempt.started_at is not None and attempt.finished_at is not None
        assert attempt.finished_at - attempt.started_at >= attempt.agent_seconds
        calls = client.calls(f"ok-{i}")
        assert len(calls) == 2  # tool call, then the answer after the tool result
        for call in calls:
            assert call.status_code == 200
            assert call.prompt_token_ids and call.response_token_ids
            assert len(call.response_logprobs) == len(call.response_token_ids)
    # A wrong answer is a finished rollout with reward 0, not a failure.
    assert done["wrong-0"].state == "SUCCEEDED"
    assert done["wrong-0"].reward == 0.0


def test_deadline_kills_the_agent_and_its_calculator(loop: tuple[Stack, list[dict]]) -> None:
    stack, rows = loop
    controller = stack.controllers[0]
    client = client_of(stack)
    before = descendants(controller.pid)
    client.create_rollouts([spec("hang-0", rows[5], marker="hang", deadline_s=4.0)])
    agent = started_pid(controller, "hang-0")
    calculator = wait_for_name(controller, before, "calcx-calc")
    during = {**rollout_processes(controller, before), agent: process_name(agent)}
    assert during[agent] == "calcx-agent" and during[calculator] == "calcx-calc"
    assert "calcx-calc-link" in during.values()  # the launcher that ties the calculator to the agent
    rollout = wait_terminal(client, ["hang-0"], timeout_s=30)["hang-0"]
    attempt = rollout.latest_attempt
    assert rollout.state == "FAILED" and attempt.reason == "timeout"
    assert "deadline" in (attempt.detail or "")
    assert wait_gone(during) == [], f"still alive after the deadline kill: {during}"


def test_agent_killed_by_a_signal_is_a_crash(loop: tuple[Stack, list[dict]]) -> None:
    stack, rows = loop
    controller = stack.controllers[0]
    client = client_of(stack)
    before = descendants(controller.pid)
    client.create_rollouts([spec("kill9-0", rows[6], marker="slow=20", deadline_s=60)])
    agent = started_pid(controller, "kill9-0")
    wait_for_name(controller, before, "calcx-calc")
    during = {**rollout_processes(controller, before), agent: process_name(agent)}
    os.kill(agent, signal.SIGKILL)
    rollout = wait_terminal(client, ["kill9-0"], timeout_s=30)["kill9-0"]
    attempt = rollout.latest_attempt
    assert rollout.state == "FAILED" and attempt.reason == "crash"
    assert "SIGKILL" in (attempt.detail or "")
    assert rollout.reward is None
    assert wait_gone(during) == [], f"left behind by the killed agent: {during}"


def test_calculator_death_fails_the_rollout_as_calculator_failed(loop: tuple[Stack, list[dict]]) -> None:
    stack, rows = loop
    controller = stack.controllers[0]
    client = client_of(stack)
    before = descendants(controller.pid)
    # The model answers after 3 s with a tool call; the calculator is dead by then.
    client.create_rollouts([spec("calc-dies-0", rows[7], marker="slow=3", deadline_s=15)])
    agent = started_pid(controller, "calc-dies-0")
    calculator = wait_for_name(controller, before, "calcx-calc")
    during = {**rollout_processes(controller, before), agent: process_name(agent)}
    time.sleep(1.0)  # most likely inside the 3 s model call by now (before it, the start fails: same reason)
    os.kill(calculator, signal.SIGKILL)
    rollout = wait_terminal(client, ["calc-dies-0"], timeout_s=40)["calc-dies-0"]
    attempt = rollout.latest_attempt
    # The agent sees its calculator die through the launcher (which exits with it) and fails the
    # rollout itself as calculator_failed (exit 11), long before the 15 s deadline.
    assert rollout.state == "FAILED", attempt
    assert attempt.reason == "calculator_failed" and attempt.exit_code == 11, attempt
    assert attempt.agent_seconds is not None and attempt.agent_seconds < 12, attempt
    assert rollout.reward is None
    assert wait_gone(during) == [], f"left behind: {during}"


def test_two_controllers_never_run_a_rollout_twice(loop: tuple[Stack, list[dict]]) -> None:
    stack, rows = loop
    first = stack.controllers[0]
    second = stack.start_controller(controller_id="second")
    # Both controllers are ready (long-polling) before the work arrives; each takes at most
    # `concurrency` (4) of the 12 at a time, so neither can take them all.
    client = client_of(stack)
    ids = [f"dup-{i}" for i in range(12)]
    client.create_rollouts([spec(rid, rows[8 + i]) for i, rid in enumerate(ids)])
    done = wait_terminal(client, ids, timeout_s=90)

    # The server's record: who claimed each rollout. Both controllers must have claimed work,
    # otherwise "never twice" was never put to the test.
    owner = {rid: r.attempts[0].controller_id for rid, r in done.items()}
    by_controller = Counter(owner.values())
    assert set(by_controller) == {"rehearsal-0", "second"}, by_controller

    # The controllers' record: which rollouts each one started. Every rollout was started exactly
    # once, by the controller the server handed it to, and each controller ran what it claimed.
    started: dict[str, Counter[str]] = {}
    for name, proc in (("rehearsal-0", first), ("second", second)):
        lines = Path(proc.log_path).read_text(errors="replace").splitlines()
        started[name] = Counter(rid for rid in ids for line in lines if f"started {rid}/1 " in line)
    starts = started["rehearsal-0"] + started["second"]
    assert starts == Counter({rid: 1 for rid in ids}), starts
    for name in ("rehearsal-0", "second"):
        assert set(started[name]) == {rid for rid, who in owner.items() if who == name}, (name, started[name], owner)

    assert all(r.state == "SUCCEEDED" and len(r.attempts) == 1 for r in done.values()), done
    # The gateway's record: one agent run per rollout means exactly one tool call and one answer
    # recorded for it (a rollout whose dialogue ran twice would have recorded four calls).
    for rid in ids:
        assert len(client.calls(rid)) == 2, (rid, owner[rid])
        assert done[rid].reward == 1.0, rid
    assert second.alive() and first.alive()


def test_server_restart_in_the_middle_loses_nothing(loop: tuple[Stack, list[dict]]) -> None:
    stack, rows = loop
    client = client_of(stack)
    ids = [f"restart-{i}" for i in range(6)]
    client.create_rollouts([spec(rid, rows[i], marker="slow=1.5") for i, rid in enumerate(ids)])
    deadline = time.monotonic() + 30
    while not any(r.state == "RUNNING" for r in client.list_rollouts(state="RUNNING")):
        assert time.monotonic() < deadline, "nothing started"
        time.sleep(0.1)
    stack.restart_server()
    client = client_of(stack)
    done = wait_terminal(client, ids, timeout_s=90)
    for rollout in done.values():
        attempt = rollout.latest_attempt
        if rollout.state == "SUCCEEDED":
            assert rollout.reward == 1.0
            assert len(client.calls(rollout.rollout_id)) == 2
        else:  # a model call that hit the restart is an infrastructure failure, never a reward
            assert attempt.reason in {"model_unreachable", "reward_post_failed"}, attempt
            assert rollout.reward is None
    assert sum(r.state == "SUCCEEDED" for r in done.values()) >= 1
    # The controllers kept their claims and reported through the restart; new work still runs.
    client.create_rollouts([spec("after-restart", rows[20])])
    assert wait_terminal(client, ["after-restart"])["after-restart"].state == "SUCCEEDED"


def test_shutdown_cancels_running_rollouts_and_leaves_no_children(loop: tuple[Stack, list[dict]]) -> None:
    stack, rows = loop
    client = client_of(stack)
    ids = [f"shutdown-{i}" for i in range(3)]
    client.create_rollouts([spec(rid, rows[21 + i], marker="slow=30") for i, rid in enumerate(ids)])
    deadline = time.monotonic() + 30
    while sum(r.state == "RUNNING" for r in client.list_rollouts(state="RUNNING")) < len(ids):
        assert time.monotonic() < deadline, "the rollouts did not start"
        time.sleep(0.1)
    tree = set()
    for controller in stack.controllers:
        tree |= descendants(controller.pid)
    assert tree
    # a clean exit within a generous grace (SIGKILL after it would show as a non-zero code); that
    # the rollouts were cancelled rather than waited for (slow=30) is in their reasons below
    codes = [c.stop(grace_s=45) for c in stack.controllers]
    assert codes == [0] * len(codes)
    assert wait_gone(tree, timeout_s=5) == []
    for rollout in wait_terminal(client, ids, timeout_s=10).values():
        assert rollout.state == "FAILED" and rollout.latest_attempt.reason == "cancelled"
