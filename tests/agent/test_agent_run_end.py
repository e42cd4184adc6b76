"""The end of a run: the reward is posted while the calculator is still up, and the calculator is
then killed, not waited for (it keeps no state, and its own shutdown would delay the agent's exit
and so the attempt's finish).

Real processes: the agent, its MCP calculator (the real one, wrapped to report its pid and to
linger after its stdin closes), the stub LLM, an event receiver.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from pathlib import Path

import openai
from agent_harness import agent_env, start_agent
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from mcp.client.stdio import PROCESS_TERMINATION_TIMEOUT

from calcx.agent.config import AgentConfig
from calcx.agent.rollout import make_workbench
from calcx.common.serving import ThreadedServer

RUN_TIMEOUT_S = 60

# The real calculator, which writes its pid to argv[1] first, ignores SIGTERM, and once its stdin
# closes (the graceful MCP shutdown) writes argv[2] and lingers: only a kill ends it at once.
LINGERING_CALCULATOR = """
import os, runpy, signal, sys, time
pid_file, eof_file = sys.argv[1], sys.argv[2]
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(pid_file, "w") as fh:
    fh.write(str(os.getpid()))
sys.argv = sys.argv[:1]
try:
    runpy.run_module("calcx.agent.calculator", run_name="__main__")
finally:
    with open(eof_file, "w") as fh:
        fh.write("stdin closed")
    time.sleep(30)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rpartition(b")")[2].split()[0]
    except OSError:
        return False
    return state not in (b"Z", b"X")


def lingering_command(tmp_path: Path) -> tuple[list[str], Path, Path]:
    pid_file, eof_file = tmp_path / "calculator.pid", tmp_path / "calculator.eof"
    return [sys.executable, "-c", LINGERING_CALCULATOR, str(pid_file), str(eof_file)], pid_file, eof_file


def test_stopping_the_workbench_kills_the_calculator_instead_of_waiting_for_it(tmp_path):
    command, pid_file, eof_file = lingering_command(tmp_path)
    config = AgentConfig(
        question="unused",
        result="0",
        base_url="http://127.0.0.1:9/v1",
        event_url="http://127.0.0.1:9/e",
        key="k",
        calculator_timeout_s=60.0,
        calculator_command=tuple(command),
    )

    async def scenario() -> float:
        workbench = make_workbench(config)
        try:
            await workbench.open()
            assert workbench.calculator_pid is not None
            assert (await workbench.call_tool("calculate", {"expression": "6 * 7"})).to_text() == "42"
        finally:
            started = time.monotonic()
            await asyncio.wait_for(workbench.stop(), 20)
        return time.monotonic() - started

    seconds = asyncio.run(scenario())
    pid = int(pid_file.read_text())
    assert not alive(pid), "the calculator outlived the workbench's stop"
    assert not eof_file.exists(), "the calculator was left to shut down on its own instead of being killed"
    # Waiting for it instead would take MCP's grace period (and then SIGTERM, which it ignores).
    assert seconds < PROCESS_TERMINATION_TIMEOUT


def test_the_reward_is_posted_before_the_calculator_is_stopped(stub_server, tmp_path):
    command, pid_file, _ = lingering_command(tmp_path)
    seen: list[tuple[dict, bool]] = []
    lock = threading.Lock()
    app = FastAPI()

    @app.post("/ok/{name}")
    async def receive(name: str, request: Request) -> JSONResponse:
        body = await request.json()
        calculator_up = pid_file.exists() and alive(int(pid_file.read_text()))
        with lock:
            seen.append((body, calculator_up))
        return JSONResponse({"event_id": str(len(seen))})

    with ThreadedServer(app) as receiver:
        env = agent_env(
            QUESTION="What is 6 * 7?",
            RESULT="42",
            AGL_OPENAI_BASE_URL=f"{stub_server.url}/v1",
            AGL_EVENT_URL=f"{receiver.url}/ok/run_end",
            AGL_KEY="key-run-end",
            CALCX_AGENT_TIMEOUT_S=str(RUN_TIMEOUT_S),
            CALCX_CALCULATOR_CMD=json.dumps(command),
        )
        run = start_agent("run_end", env)
        try:
            run.wait(RUN_TIMEOUT_S + 30)
        finally:
            run.end()
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1])["reward"] == 1.0
    assert len(seen) == 1
    body, calculator_up = seen[0]
    assert body["data"]["value"] == 1.0
    assert calculator_up, "the reward waited for the calculator's teardown"
    assert not alive(int(pid_file.read_text())), "the calculator outlived the agent"


def test_the_model_client_uses_the_process_tls_context_not_a_fresh_one():
    # a fresh verifying context loads the CA bundle before the first model call (tens of ms)
    from calcx.agent.rollout import make_model_client
    from calcx.api.client import tls_context

    for base_url in ("http://127.0.0.1:9/v1", "https://gateway.test/v1"):
        config = AgentConfig(question="q", result="0", base_url=base_url, event_url="http://127.0.0.1:9/e", key="k")
        client = make_model_client(config)
        try:
            http = client._client._client  # AutoGen's AsyncOpenAI, then its httpx client
            assert http._transport._pool._ssl_context is tls_context(base_url)  # type: ignore[attr-defined]
            assert http.timeout == openai.DefaultAsyncHttpxClient().timeout  # openai's own defaults kept
        finally:
            asyncio.run(client.close())


def _receiver() -> tuple[FastAPI, list[dict]]:
    seen: list[dict] = []
    app = FastAPI()

    @app.post("/ok/{name}")
    async def receive(name: str, request: Request) -> JSONResponse:
        seen.append(await request.json())
        return JSONResponse({"event_id": str(len(seen))})

    return app, seen


def _run_in_process(monkeypatch, receiver_url: str, solve) -> int:
    """`run_agent` in this process with a 1 s run deadline and `solve` standing in for the agent's."""
    import calcx.agent.rollout
    from calcx.agent.main import run_agent

    monkeypatch.setattr(calcx.agent.rollout, "solve", solve)
    env = agent_env(
        QUESTION="What is 6 * 7?",
        RESULT="42",
        AGL_OPENAI_BASE_URL="http://127.0.0.1:9/v1",
        AGL_EVENT_URL=f"{receiver_url}/ok/deadline",
        AGL_KEY="key-deadline",
        CALCX_AGENT_TIMEOUT_S="1",
    )
    return run_agent(env)


def test_a_deadline_passing_during_the_teardown_after_the_reward_is_still_a_finished_run(monkeypatch, capfd):
    # The reward is posted before the teardown; if the run's deadline then passes while the calculator
    # and the model client stop, the run had finished: status 0, the posted reward, never a timeout.
    async def slow_teardown(config, report):
        outcome = await report("### ANSWER: 42 ###")
        await asyncio.sleep(5)  # the teardown outlasting the 1 s deadline
        return outcome

    app, seen = _receiver()
    with ThreadedServer(app) as receiver:
        status = _run_in_process(monkeypatch, receiver.url, slow_teardown)
    err = capfd.readouterr().err
    assert status == 0, err[-2000:]
    assert [body["data"]["value"] for body in seen] == [1.0]
    assert "finished reward=1" in err and "failure" not in err


def test_a_deadline_passing_before_the_reward_is_a_timeout_with_nothing_posted(monkeypatch, capfd):
    from calcx.contract.failures import EXIT_CODES, FailureReason, parse_failure_line

    async def never_answers(config, report):
        await asyncio.sleep(5)
        return await report("### ANSWER: 42 ###")

    app, seen = _receiver()
    with ThreadedServer(app) as receiver:
        status = _run_in_process(monkeypatch, receiver.url, never_answers)
    err = capfd.readouterr().err
    assert status == EXIT_CODES[FailureReason.TIMEOUT]
    assert seen == []
    assert parse_failure_line(err) == FailureReason.TIMEOUT
