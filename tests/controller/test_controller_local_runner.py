"""The local runner on its own: real processes, exit statuses, deadlines, cancels and the
environment an agent gets (the pre-forked worker's own restart: tests/worker)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time

import pytest
from controller_harness import claim, wait_gone

from calcx.contract.failures import reason_from_agent_exit
from calcx.contract.ready import WORKER_READY_LINE
from calcx.controller.__main__ import main as controller_main
from calcx.controller.base import RunResult
from calcx.controller.local_runner import LocalRunner, parse_command_option
from calcx.procs.procutil import pid_alive


def run_command(code: str, deadline_s: float = 30.0) -> RunResult:
    async def go() -> RunResult:
        runner = LocalRunner(agent_cmd=[sys.executable, "-c", code], prefork=False)
        await runner.start()
        try:
            return await runner.run(claim(deadline_s=deadline_s))
        finally:
            await runner.close()

    return asyncio.run(go())


def test_exit_zero_is_succeeded_with_the_time_inside_the_agent() -> None:
    result = run_command("import time; time.sleep(0.2)")
    assert result.state == "SUCCEEDED" and result.reason is None and result.exit_code == 0
    assert result.agent_seconds is not None and result.agent_seconds >= 0.2


def test_the_agents_own_failure_line_names_the_reason() -> None:
    code = (
        "import sys; print('calcx-agent: failure: model_unreachable gateway said 502', file=sys.stderr); sys.exit(10)"
    )
    result = run_command(code)
    assert (result.state, result.reason, result.exit_code) == ("FAILED", "model_unreachable", 10)
    assert "gateway said 502" in (result.detail or "")


def test_exit_code_map_without_a_failure_line() -> None:
    assert run_command("import sys; sys.exit(11)").reason == "calculator_failed"
    assert run_command("import sys; sys.exit(3)").reason == "crash"


def test_death_by_signal_is_a_crash() -> None:
    result = run_command("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert (result.state, result.reason, result.exit_code) == ("FAILED", "crash", -signal.SIGKILL)
    assert "SIGKILL" in (result.detail or "")


def test_deadline_kills_the_whole_process_group(tmp_path) -> None:
    pids = tmp_path / "pids"
    code = (
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "time.sleep(60)\n"
    )
    t0 = time.monotonic()
    result = run_command(code, deadline_s=1.5)
    assert (result.state, result.reason) == ("FAILED", "timeout")
    # the agent sleeps 60 s: ending well before that (~2 s here) means the deadline killed it
    assert time.monotonic() - t0 < 30
    agent, grandchild = (int(p) for p in pids.read_text().split())
    deadline = time.monotonic() + 5
    while (pid_alive(agent) or pid_alive(grandchild)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(agent) and not pid_alive(grandchild)


FAKE_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_worker.py")
#: Loop passes between the worker's answer reaching the socket and the cancel: 0 is before the
#: runner reads the answer, the last ones are after it has the agent's pid; Python 3.11's
#: asyncio.wait_for lost a cancel that landed 1 or 2 passes after the answer.
CANCEL_PASSES = range(12)
#: A lost cancel leaves the run waiting for the agent to end by itself (never, here); a kept one
#: ends it at once (the whole scan of 12 starts took ~0.5 s on 2 busy cores).
CANCEL_CEILING_S = 30.0


def test_shutdown_a_cancel_at_any_moment_of_an_agent_start_ends_the_run(tmp_path) -> None:
    """What the controller's shutdown relies on: it cancels each running rollout once and waits
    for it, so a cancel the runner loses keeps the controller alive until that agent's deadline."""

    async def go() -> list[str]:
        runner = LocalRunner(
            zygote_cmd=[sys.executable, FAKE_WORKER, "--ready-line", WORKER_READY_LINE, "--dir", str(tmp_path)],
            fallback_to_spawn=False,
        )
        await runner.start()
        lost: list[str] = []
        try:
            for n, passes in enumerate(CANCEL_PASSES, start=1):
                task = asyncio.create_task(runner.run(claim(rid=f"r{n}", deadline_s=600)))
                request = tmp_path / f"request-{n}"
                while not request.exists():
                    await asyncio.sleep(0.002)
                agent = int(request.read_text())
                (tmp_path / f"go-{n}").write_text("")
                # The loop stands still until the worker's answer is in the runner's socket.
                answered = time.monotonic() + 10
                while not (tmp_path / f"replied-{n}").exists():
                    assert time.monotonic() < answered, "the fake worker did not answer"
                    time.sleep(0.001)
                for _ in range(passes):
                    await asyncio.sleep(0)
                task.cancel()
                done, _ = await asyncio.wait({task}, timeout=CANCEL_CEILING_S)
                if not done or not task.cancelled():
                    lost.append(f"a cancel {passes} loop passes after the worker answered was lost")
                    break
                if wait_gone([agent], timeout_s=10) != []:
                    lost.append(f"the agent of a run cancelled {passes} loop passes after the answer is alive")
        finally:
            await runner.close()
        return lost

    lost = asyncio.run(go())
    assert lost == [], "\n".join(lost)


def test_reason_parsing_and_result_validation() -> None:
    tail = "noise\ncalcx-agent: failure: calculator_failed calculator did not answer\n"
    assert reason_from_agent_exit(1, tail) == "calculator_failed"
    assert reason_from_agent_exit(13, "no marker") == "reward_post_failed"
    assert reason_from_agent_exit(-9, None) == "crash"
    assert reason_from_agent_exit(12, "calcx-agent: failure: bogus x") == "timeout"
    with pytest.raises(ValueError, match="not a known failure reason"):
        RunResult.failed("gremlins")  # type: ignore[arg-type]  # refused at run time too
    assert RunResult.succeeded(agent_seconds=1.0).finish_body() == {
        "state": "SUCCEEDED",
        "reason": None,
        "exit_code": 0,
        "agent_seconds": 1.0,
        "detail": None,
    }


def test_agent_command_parsing() -> None:
    assert parse_command_option('["/app/agent.pex", "--x"]') == ["/app/agent.pex", "--x"]
    assert parse_command_option("python -m calcx.agent") == ["python", "-m", "calcx.agent"]
    with pytest.raises(ValueError):
        parse_command_option(json.dumps([]))


def test_controller_without_a_key_says_what_to_do(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.delenv("CALCX_KEY", raising=False)
    assert controller_main(["--server", "http://127.0.0.1:9"]) == 2
    assert "CALCX_KEY" in capsys.readouterr().err
    monkeypatch.setenv("CALCX_KEY", "k" * 31)
    assert controller_main(["--concurrency", "1"]) == 2
    err = capsys.readouterr().err
    assert "fewer than 32" in err and "calcx server --new-key" in err
    monkeypatch.setenv("CALCX_KEY", "k" * 32)
    assert controller_main(["--concurrency", "0"]) == 2


#: Secrets a trainer's environment holds: none may reach an agent or its calculator.
CONTROLLER_SECRETS = {"CALCX_KEY": "s" * 40, "WANDB_API_KEY": "wandb-secret", "AWS_SECRET_ACCESS_KEY": "aws-secret"}
DUMP_ENV = "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))"


@pytest.mark.parametrize("prefork", [True, False], ids=["forked", "spawned"])
def test_an_agent_and_its_calculator_inherit_only_the_allowlist(tmp_path, prefork: bool) -> None:
    """The runner's secrets stay with the runner: a forked agent's calculator (started by the
    real agent in the worker) and a spawned agent see the allowlist plus the claim's variables."""
    dump = tmp_path / "env.json"
    calc = json.dumps([sys.executable, "-c", DUMP_ENV, str(dump)])
    claim_env = {
        "QUESTION": "1+1",
        "RESULT": "2",
        "AGL_OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
        "AGL_EVENT_URL": "http://127.0.0.1:9/events",
        "AGL_KEY": "attempt-token",
        "CALCX_CALCULATOR_CMD": calc,
        "CALCX_CALCULATOR_TIMEOUT_S": "5",
    }

    async def go() -> RunResult:
        env = {**os.environ, **CONTROLLER_SECRETS, "LC_ALL": "C.UTF-8"}
        agent_cmd = None if prefork else [sys.executable, "-c", DUMP_ENV, str(dump)]
        runner = LocalRunner(env=env, prefork=prefork, agent_cmd=agent_cmd, fallback_to_spawn=False)
        await runner.start()
        try:
            return await runner.run(claim(env=claim_env))
        finally:
            await runner.close()

    asyncio.run(go())
    seen = json.loads(dump.read_text())
    assert not set(CONTROLLER_SECRETS) & set(seen), sorted(seen)
    assert not any(value in CONTROLLER_SECRETS.values() for value in seen.values())
    assert seen["PATH"] == os.environ["PATH"] and seen["LC_ALL"] == "C.UTF-8"
    assert seen["CALCX_CALCULATOR_TIMEOUT_S"] == "5"  # the claim's own variables still arrive
