"""A calculator that dies or hangs in the middle of a rollout fails it as calculator_failed (exit 11)
promptly, never as a timeout at the run deadline, and model mistakes still go back to the model.
The first model call does not wait for the calculator to start; tool calls do.

Real processes throughout: the agent, the MCP calculator it starts, the stub LLM.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from agent_harness import AgentRun, EventLog, agent_env, start_agent

from calcx.agent.config import AgentConfig
from calcx.agent.failures import CalculatorFailed
from calcx.agent.rollout import make_workbench
from calcx.agent.workbench import CALCULATOR_TOOLS
from calcx.common.serving import ThreadedServer
from calcx.stub_llm.app import create_app

RUN_TIMEOUT_S = 60  # the whole-run deadline of these agents; every failure here must come well before it
START_TIMEOUT_S = 60.0  # a calculator's start and handshake on a loaded machine (a test sandbox's interpreter)
SLOW_S = 3.0

# An MCP server whose `calculate` tool never answers (it lists its tools normally).
HANGING_CALCULATOR = """
import time
from mcp.server.fastmcp import FastMCP
server = FastMCP("hanging-calculator")

@server.tool()
def calculate(expression: str) -> str:
    'Calculates/evaluates the given expression.'
    time.sleep(600)
    return "0"

server.run(transport="stdio")
"""

# The real calculator, started only once the file named by argv[1] exists (at most 60 s later).
GATED_CALCULATOR = """
import os, runpy, sys, time
gate, deadline = sys.argv[1], time.monotonic() + 60
while not os.path.exists(gate) and time.monotonic() < deadline:
    time.sleep(0.02)
sys.argv = sys.argv[:1]
runpy.run_module("calcx.agent.calculator", run_name="__main__")
"""


class ArrivalLog:
    """Chat requests the stub has received and finished (the stub records only after its delay)."""

    def __init__(self) -> None:
        self.arrived = 0
        self.finished = 0
        self.lock = threading.Lock()

    def wait_arrived(self, count: int, run: AgentRun, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and run.proc.poll() is None:
            with self.lock:
                if self.arrived >= count:
                    return
            time.sleep(0.02)
        raise AssertionError(f"the agent made no model call in {timeout_s:g} s (exit {run.proc.poll()})")

    def wait_idle(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                if self.finished >= self.arrived:
                    return
            time.sleep(0.05)


@pytest.fixture(scope="module")
def counted_stub() -> Iterator[tuple[ThreadedServer, ArrivalLog]]:
    app = create_app()
    arrivals = ArrivalLog()

    @app.middleware("http")
    async def count(request, call_next):  # type: ignore[no-untyped-def]
        if request.url.path.endswith("/chat/completions"):
            with arrivals.lock:
                arrivals.arrived += 1
        try:
            return await call_next(request)
        finally:
            if request.url.path.endswith("/chat/completions"):
                with arrivals.lock:
                    arrivals.finished += 1

    with ThreadedServer(app) as server:
        try:
            yield server, arrivals
        finally:
            arrivals.wait_idle(SLOW_S + 10)  # let an abandoned slow request end before the server stops


def session_children(pid: int) -> list[int]:
    """Children of `pid` that lead a session of their own (how the MCP client starts a calculator)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rpartition(b")")[2].split()
        except OSError:
            continue
        if fields[0] not in (b"Z", b"X") and int(fields[1]) == pid and int(fields[3]) == int(entry):
            found.append(int(entry))
    return found


def run_env(stub_url: str, event_url: str, name: str, question: str, result: str, **extra: str) -> dict[str, str]:
    return agent_env(
        QUESTION=question,
        RESULT=result,
        AGL_OPENAI_BASE_URL=f"{stub_url}/v1",
        AGL_EVENT_URL=f"{event_url}/ok/{name}",
        AGL_KEY=f"key-{name}",
        CALCX_AGENT_TIMEOUT_S=str(RUN_TIMEOUT_S),
        **extra,
    )


def assert_calculator_failed(run: AgentRun, event_log: EventLog) -> None:
    assert run.returncode == 11, f"{run.name}: exit {run.returncode}, wanted 11\n{run.stderr[-3000:]}"
    assert run.last_stderr_line.startswith("calcx-agent: failure: calculator_failed "), run.stderr[-2000:]
    assert event_log.for_path(f"/ok/{run.name}") == [], "no reward may be posted on an infrastructure failure"


@pytest.fixture(scope="module")
def tool_hang_run(stub_server, event_server) -> Iterator[AgentRun]:
    """An agent whose calculator never answers a tool call (started early: it runs alongside the others)."""
    env = run_env(
        stub_server.url,
        event_server.url,
        "calc_tool_hang",
        "What is 6 * 7?",
        "42",
        CALCX_CALCULATOR_CMD=json.dumps([sys.executable, "-c", HANGING_CALCULATOR]),
        CALCX_CALCULATOR_TIMEOUT_S="2",
    )
    run = start_agent("calc_tool_hang", env)
    try:
        yield run
    finally:
        run.end()


def test_calculator_killed_while_the_model_thinks_exits_11_at_once(
    counted_stub, event_server, event_log, tool_hang_run
):
    stub, arrivals = counted_stub
    env = run_env(stub.url, event_server.url, "calc_killed", f"[stub:slow={SLOW_S:g}] What is 6 * 7?", "42")
    run = start_agent("calc_killed", env)
    try:
        arrivals.wait_arrived(1, run, timeout_s=90)
        calculators = session_children(run.proc.pid)
        assert len(calculators) == 1, f"expected one calculator child of the agent, found {calculators}"
        os.kill(calculators[0], signal.SIGKILL)
        killed = time.monotonic()
        run.wait(RUN_TIMEOUT_S + 30)
        after_kill = time.monotonic() - killed
    finally:
        run.end()
    assert_calculator_failed(run, event_log)
    # Killed after its start, the watch names the process (and its exit status when it can still be
    # read); killed during its start (the first model call does not wait for it), the MCP connection
    # closes: either way the calculator's failure, at once.
    line = run.last_stderr_line
    assert f"calculator process (pid {calculators[0]})" in line or "calculator connection closed" in line, line
    assert after_kill < 5.0, f"the calculator's death took {after_kill:.1f} s to fail the run"
    # The run ended during the first model call: the tool was never called, no second model turn.
    arrivals.wait_idle(SLOW_S + 10)
    assert arrivals.arrived == 1


def test_calculator_hung_on_a_tool_call_exits_11_after_the_read_timeout(tool_hang_run, event_log):
    run = tool_hang_run.wait(RUN_TIMEOUT_S + 30)
    assert_calculator_failed(run, event_log)
    # The read timeout ends the call; under load the MCP session may tear its stream down first,
    # which reads as a transport failure: both are the calculator failing, well before the deadline.
    line = run.last_stderr_line
    assert "in time" in line or "calculator transport failed" in line, line
    assert run.seconds < RUN_TIMEOUT_S / 2, f"took {run.seconds:.1f} s: the failure waited for the run deadline"


def _config() -> AgentConfig:
    return AgentConfig(
        question="unused",
        result="0",
        base_url="http://127.0.0.1:9/v1",
        event_url="http://127.0.0.1:9/e",
        key="k",
        calculator_timeout_s=10.0,
        calculator_command=(sys.executable, "-m", "calcx.agent.calculator"),
    )


async def _tool_task_like_autogen(workbench, arguments: dict) -> str:  # type: ignore[no-untyped-def]
    """AutoGen runs tool calls in a task and waits on a queue that only a successful call fills;
    an exception raised by call_tool is lost there. The guard must end such a run anyway."""
    results: asyncio.Queue[str] = asyncio.Queue()

    async def execute() -> None:
        result = await workbench.call_tool("calculate", arguments)
        await results.put(result.to_text())

    task = asyncio.create_task(execute())  # noqa: F841 - deliberately not awaited, as in AutoGen
    return await results.get()


def test_workbench_fails_a_tool_call_to_a_dead_calculator_and_returns_model_mistakes():
    async def scenario() -> tuple[list[str], str, float, list[int]]:
        workbench = make_workbench(_config())
        try:
            await workbench.open()
            pid = workbench.calculator_pid
            assert pid is not None and session_children(os.getpid()) == [pid]
            # The model's mistakes are answers for the model, not failures.
            answers = [
                await workbench.guard(_tool_task_like_autogen(workbench, {"expression": "6 * 7"})),
                await workbench.guard(_tool_task_like_autogen(workbench, {"expr": "6 * 7"})),
                (await workbench.call_tool("no_such_tool", {})).to_text(),
            ]
            assert workbench.failure is None
            # Without the process watch, only the broken transport can tell: it must still fail fast.
            workbench.unwatch()
            os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(0.5)
            started = time.monotonic()
            with pytest.raises(CalculatorFailed) as failed:
                await asyncio.wait_for(workbench.guard(_tool_task_like_autogen(workbench, {"expression": "1"})), 20)
            return answers, failed.value.detail, time.monotonic() - started, session_children(os.getpid())
        finally:
            await asyncio.wait_for(workbench.stop(), 10)

    answers, detail, seconds, left = asyncio.run(scenario())
    assert answers[0] == "42"
    assert "expression" in answers[1] and answers[1] != "42"  # a validation error naming the argument
    assert "no_such_tool" in answers[2] or "Unknown tool" in answers[2]
    assert "calculator" in detail
    assert seconds < 3.0, f"a dead calculator took {seconds:.1f} s to fail the tool call"
    assert left == []


def test_workbench_watch_fails_the_run_when_the_calculator_dies_mid_run():
    async def scenario() -> tuple[str, float]:
        workbench = make_workbench(_config())
        try:
            await workbench.open()
            pid = workbench.calculator_pid
            assert pid is not None
            loop = asyncio.get_running_loop()
            loop.call_later(0.3, os.kill, pid, signal.SIGKILL)
            started = time.monotonic()
            with pytest.raises(CalculatorFailed) as failed:
                # Stands for a model call that would take far longer than the test.
                await workbench.guard(asyncio.sleep(60))
            return failed.value.detail, time.monotonic() - started
        finally:
            await asyncio.wait_for(workbench.stop(), 10)

    detail, seconds = asyncio.run(scenario())
    assert detail.startswith("calculator process (pid ") and ("exited" in detail or "signal 9" in detail)
    # noticed at once (~0.3 s here), not after the 60 s call it guards: 30 s still tells them apart
    assert seconds < 30.0


def test_first_model_call_is_sent_before_the_calculator_starts(counted_stub, event_server, event_log, tmp_path):
    stub, _ = counted_stub
    gate = tmp_path / "gate"
    env = run_env(
        stub.url,
        event_server.url,
        "calc_gated",
        "What is 7 * 8?",
        "56",
        CALCX_CALCULATOR_CMD=json.dumps([sys.executable, "-c", GATED_CALCULATOR, str(gate)]),
    )
    run = start_agent("calc_gated", env)
    try:
        deadline = time.monotonic() + 45  # well before the gate gives up waiting (60 s)
        while not [e for e in stub.app.state.log if "What is 7 * 8?" in e["question"] and e["kind"] == "tool_call"]:
            assert run.proc.poll() is None and time.monotonic() < deadline, "no model call while the calculator waited"
            time.sleep(0.02)
        assert run.proc.poll() is None
        gate.touch()  # only now can the calculator start and answer its handshake
        run.wait(RUN_TIMEOUT_S + 30)
    finally:
        run.end()
    assert run.returncode == 0, run.stderr[-3000:]
    # the stub answers with the tool's result: reward 1 means the real calculator computed 56
    assert json.loads(run.stdout.strip().splitlines()[-1])["reward"] == 1.0
    assert len(event_log.for_path("/ok/calc_gated")) == 1


def test_the_announced_tool_schema_is_what_the_real_calculator_lists():
    async def scenario() -> list:
        workbench = make_workbench(dataclasses.replace(_config(), calculator_timeout_s=START_TIMEOUT_S))
        try:
            return await workbench.open()
        finally:
            await workbench.stop()

    assert asyncio.run(scenario()) == CALCULATOR_TOOLS


def test_a_calculator_listing_other_tools_fails_the_run():
    other = HANGING_CALCULATOR.replace("    'Calculates/evaluates the given expression.'\n", "")
    config = dataclasses.replace(
        _config(), calculator_command=(sys.executable, "-c", other), calculator_timeout_s=START_TIMEOUT_S
    )

    async def scenario() -> str:
        workbench = make_workbench(config)
        workbench.open_soon()
        try:
            with pytest.raises(CalculatorFailed) as failed:
                await asyncio.wait_for(workbench.opened(), 2 * START_TIMEOUT_S)
            return failed.value.detail
        finally:
            await workbench.stop()

    assert "not the announced" in asyncio.run(scenario())
