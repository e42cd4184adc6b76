"""End to end: the real agent process against the real stub LLM, MCP calculator and an event receiver.

Agent processes are expensive to start (AutoGen import), so every scenario is launched
at once by one module fixture and each test then checks its own scenario's outcome.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator

import pytest
from agent_harness import SCRIPTED, AgentRun, EventLog, agent_env, closed_port, start_agent

WAIT_S = 180.0
HANG_TIMEOUT_S = 20
WORD_PROBLEM, FRACTION_PROBLEM = list(SCRIPTED)

FORKED_WORKER = """
import os, sys
import calcx.agent.rollout  # imported before the fork, as a pre-forked worker does
from calcx.agent.main import run_agent
pid = os.fork()
if pid == 0:
    code = run_agent(dict(os.environ))
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(code)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def _scenarios(stub_url: str, event_url: str) -> dict[str, tuple[dict[str, str], list[str] | None]]:
    """name -> (environment overrides, argv or None for `python -m calcx.agent`)."""
    model = f"{stub_url}/v1"

    def env(name: str, question: str, result: str, **extra: str) -> dict[str, str]:
        return {
            "QUESTION": question,
            "RESULT": result,
            "AGL_OPENAI_BASE_URL": model,
            "AGL_EVENT_URL": f"{event_url}/ok/{name}",
            "AGL_KEY": f"key-{name}",
            **extra,
        }

    py = sys.executable
    scenarios = {
        # Started alone first (see `runs`), so that its whole-run timer is not eaten by start-up contention.
        "hang": env("hang", "[stub:hang] What is 2 + 2?", "4", CALCX_AGENT_TIMEOUT_S=str(HANG_TIMEOUT_S)),
        "scripted": env("scripted", WORD_PROBLEM, SCRIPTED[WORD_PROBLEM][1]),
        "fraction": env("fraction", FRACTION_PROBLEM, SCRIPTED[FRACTION_PROBLEM][1]),
        "in_text": env("in_text", "What is 12 * (3 + 4)?", "84"),
        # the stub answers 96, 0.5% short of the row's result: within Calc-X's 1e-2, not exact
        "close": env("close", "What is 12 * (3 + 5)?", "96.5"),
        "close_exact": env("close_exact", "What is 12 * (3 + 5)?", "96.5", RESULT_REL_TOL="1e-09"),
        "wrong": env("wrong", "[stub:wrong] What is 6 * 7?", "42"),
        "noformat": env("noformat", "[stub:noformat] What is 6 * 7?", "42"),
        "badjson": env("badjson", "[stub:badjson] What is 6 * 7?", "42"),
        "unknowntool": env("unknowntool", "[stub:unknowntool] What is 6 * 7?", "42"),
        "unreachable": env(
            "unreachable",
            "What is 1 + 1?",
            "2",
            AGL_OPENAI_BASE_URL=f"http://127.0.0.1:{closed_port()}/v1",
            CALCX_MODEL_MAX_RETRIES="1",
        ),
        "error500": env("error500", "[stub:error500] What is 1 + 2?", "3", CALCX_MODEL_MAX_RETRIES="1"),
        "overlong": env("overlong", "[stub:overlong] What is 2 + 5?", "7", CALCX_AGENT_TOOL_ROUNDS="3"),
        "calc_dead": env(
            "calc_dead",
            "[calc_dead] What is 3 + 3?",
            "6",
            CALCX_CALCULATOR_CMD=json.dumps([py, "-c", "import sys; sys.exit(3)"]),
        ),
        "calc_hung": env(
            "calc_hung",
            "[calc_hung] What is 4 + 4?",
            "8",
            CALCX_CALCULATOR_CMD=json.dumps([py, "-c", "import time; time.sleep(60)"]),
            CALCX_CALCULATOR_TIMEOUT_S="2",
        ),
        # tool rounds: the stub chains one call a round (6*7, then +1 each), so the answer shows
        # how many rounds the agent allowed before its last call, without tools, had to answer
        "one_round": env("one_round", "[stub:steps=3] What is 6 * 8?", "48"),
        "three_rounds": env("three_rounds", "[stub:steps=3] What is 5 * 8?", "42", CALCX_AGENT_TOOL_ROUNDS="3"),
        "capped_rounds": env("capped_rounds", "[stub:steps=9] What is 4 * 9?", "38", CALCX_AGENT_TOOL_ROUNDS="3"),
        "badjson_rounds": env("badjson_rounds", "[stub:badjson] What is 3 * 9?", "27", CALCX_AGENT_TOOL_ROUNDS="3"),
        "calc_dead_rounds": env(
            "calc_dead_rounds",
            "[stub:steps=3] What is 7 * 7?",
            "51",
            CALCX_AGENT_TOOL_ROUNDS="3",
            CALCX_CALCULATOR_CMD=json.dumps([py, "-c", "import sys; sys.exit(3)"]),
        ),
        "calculator_first": env("calculator_first", "What is 9 * 9?", "81", CALCX_AGENT_PROMPT="calculator-first"),
        "rejected": {**env("rejected", "What is 5 * 5?", "25"), "AGL_EVENT_URL": f"{event_url}/reject/rejected"},
        "forked": env("forked", WORD_PROBLEM, SCRIPTED[WORD_PROBLEM][1]),
    }
    return {
        name: (overrides, [py, "-c", FORKED_WORKER] if name == "forked" else None)
        for name, overrides in scenarios.items()
    }


def _wait_for_hang_request(stub_server, run: AgentRun, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and run.proc.poll() is None:
        try:
            if any(e["kind"] == "hang" for e in list(stub_server.app.state.log)):
                return
        except RuntimeError:  # the log changed while being copied; look again
            pass
        time.sleep(0.05)


@pytest.fixture(scope="module")
def runs(stub_server, event_server) -> Iterator[dict[str, AgentRun]]:
    started: dict[str, AgentRun] = {}
    try:
        for name, (overrides, argv) in _scenarios(stub_server.url, event_server.url).items():
            started[name] = start_agent(name, agent_env(**overrides), argv)
            if name == "hang":
                _wait_for_hang_request(stub_server, started[name])
        deadline = time.monotonic() + WAIT_S
        for run in started.values():
            run.wait(deadline - time.monotonic())
        yield started
    finally:
        for run in started.values():
            run.end()


def rewards(event_log: EventLog, name: str, kind: str = "ok") -> list[tuple[str | None, dict]]:
    return event_log.for_path(f"/{kind}/{name}")


def assert_finished(run: AgentRun, event_log: EventLog, expected_reward: float) -> None:
    assert run.returncode == 0, f"{run.name}: exit {run.returncode}\n{run.stderr[-3000:]}"
    posted = rewards(event_log, run.name)
    assert posted == [
        (f"Bearer key-{run.name}", {"event_type": "reward", "data": {"value": expected_reward}})
    ], run.stderr[-2000:]
    assert run.last_stderr_line.startswith(f"calcx-agent: finished reward={expected_reward:g}")


def assert_failed(run: AgentRun, event_log: EventLog, code: int, reason: str) -> None:
    assert run.returncode == code, f"{run.name}: exit {run.returncode}, wanted {code}\n{run.stderr[-3000:]}"
    assert run.last_stderr_line.startswith(f"calcx-agent: failure: {reason} "), run.stderr[-2000:]
    assert rewards(event_log, run.name) == [], "no reward may be posted on an infrastructure failure"


def test_scripted_word_problem_scores_one(runs, event_log):
    assert_finished(runs["scripted"], event_log, 1.0)
    summary = json.loads(runs["scripted"].stdout.strip().splitlines()[-1])
    assert summary["answer"] == "89" and summary["reward"] == 1.0


def test_fraction_result_within_tolerance_scores_one(runs, event_log):
    assert_finished(runs["fraction"], event_log, 1.0)


def test_arithmetic_found_in_question_scores_one(runs, event_log):
    assert_finished(runs["in_text"], event_log, 1.0)


def test_the_rows_tolerance_decides_the_reward(runs, event_log):
    """RESULT_REL_TOL (the hard split's rows ask for the exact answer) is the reward's tolerance;
    without it, Calc-X's 1e-2."""
    assert_finished(runs["close"], event_log, 1.0)
    assert_finished(runs["close_exact"], event_log, 0.0)


def test_agent_in_forked_worker_scores_one(runs, event_log):
    assert_finished(runs["forked"], event_log, 1.0)


@pytest.mark.parametrize("name", ["wrong", "noformat", "badjson", "unknowntool"])
def test_model_mistakes_finish_with_reward_zero(runs, event_log, name):
    assert_finished(runs[name], event_log, 0.0)


def _model_turns(stub_server, question: str) -> list[str]:
    return [e["kind"] for e in list(stub_server.app.state.log) if e["question"].startswith(question)]


def test_one_tool_round_by_default_then_the_answer(runs, event_log, stub_server):
    assert_finished(runs["one_round"], event_log, 1.0)  # 48: the first result, no second round
    assert _model_turns(stub_server, "What is 6 * 8?") == ["tool_call", "answer"]


def test_the_agent_opens_with_the_system_message_its_setting_names(runs, event_log, stub_server):
    """CALCX_AGENT_PROMPT picks the system message of every model call; without it, `plain`."""
    from calcx.agent.answer import SYSTEM_MESSAGES
    from calcx.stub_llm.app import LOGGED_SYSTEM_CHARS

    assert_finished(runs["calculator_first"], event_log, 1.0)
    assert_finished(runs["one_round"], event_log, 1.0)

    def systems(question: str) -> set[str]:
        return {e["system"] for e in list(stub_server.app.state.log) if e["question"].startswith(question)}

    assert systems("What is 9 * 9?") == {SYSTEM_MESSAGES["calculator-first"][:LOGGED_SYSTEM_CHARS]}
    assert systems("What is 6 * 8?") == {SYSTEM_MESSAGES["plain"][:LOGGED_SYSTEM_CHARS]}


def test_tool_rounds_see_each_result_before_the_next_call(runs, event_log, stub_server):
    assert_finished(runs["three_rounds"], event_log, 1.0)  # 40, 41, 42: each call on the last result
    assert _model_turns(stub_server, "What is 5 * 8?") == ["tool_call"] * 3 + ["answer"]


def test_tool_rounds_stop_at_the_setting_and_the_agent_must_answer(runs, event_log, stub_server):
    assert_finished(runs["capped_rounds"], event_log, 1.0)  # 36, 37, 38 and no fourth call
    assert _model_turns(stub_server, "What is 4 * 9?") == ["tool_call"] * 3 + ["answer"]


def test_an_unparseable_call_in_a_multi_round_run_is_the_agents_own_failure(runs, event_log):
    assert_finished(runs["badjson_rounds"], event_log, 0.0)


def test_a_dead_calculator_in_a_multi_round_run_is_infrastructure(runs, event_log):
    assert_failed(runs["calc_dead_rounds"], event_log, 11, "calculator_failed")


def test_unreachable_model_exits_10(runs, event_log):
    assert_failed(runs["unreachable"], event_log, 10, "model_unreachable")


def test_http_500_exits_10_after_retries(runs, event_log, stub_server):
    assert_failed(runs["error500"], event_log, 10, "model_unreachable")
    log = [e for e in stub_server.app.state.log if e["question"].startswith("What is 1 + 2?")]
    assert [e["kind"] for e in log] == ["error500", "error500"]  # first try + CALCX_MODEL_MAX_RETRIES=1


def test_a_conversation_past_the_models_context_finishes_unanswered_not_as_a_model_failure(runs, event_log):
    """vLLM's 400 for a conversation that outgrew the context is the policy's doing: reward 0,
    exit 0 (a `model_unreachable` would be retried and left out of training)."""
    assert_finished(runs["overlong"], event_log, 0.0)
    summary = json.loads(runs["overlong"].stdout.strip().splitlines()[-1])
    assert summary["answer"] == "" and summary["reward"] == 0.0


def test_dead_calculator_exits_11(runs, event_log):
    # The first model call may be under way when the calculator's start fails (it does not wait
    # for the calculator); the rollout still fails as the calculator's fault, with no reward.
    assert_failed(runs["calc_dead"], event_log, 11, "calculator_failed")


def test_hung_calculator_exits_11(runs, event_log):
    assert_failed(runs["calc_hung"], event_log, 11, "calculator_failed")
    assert "in time" in runs["calc_hung"].last_stderr_line


def test_hanging_model_exits_12_at_the_run_timeout(runs, event_log, stub_server):
    run = runs["hang"]
    assert_failed(run, event_log, 12, "timeout")
    assert any(e["kind"] == "hang" for e in stub_server.app.state.log if e["question"].startswith("What is 2 + 2?"))
    assert HANG_TIMEOUT_S <= run.seconds < HANG_TIMEOUT_S + 30


def test_rejected_reward_post_exits_13(runs, event_log):
    run = runs["rejected"]
    assert run.returncode == 13, run.stderr[-2000:]
    assert run.last_stderr_line.startswith("calcx-agent: failure: reward_post_failed ")
    assert "HTTP 401" in run.last_stderr_line
    assert len(rewards(event_log, "rejected", kind="reject")) == 1  # a 4xx is not retried


def test_bad_environment_exits_2_naming_the_variable(stub_server, event_server):
    env = agent_env(
        QUESTION="What is 1 + 1?",
        RESULT="2",
        AGL_OPENAI_BASE_URL=f"{stub_server.url}/v1",
        AGL_EVENT_URL=f"{event_server.url}/ok/badenv",
        AGL_KEY="",
    )
    run = start_agent("badenv", env).wait(60)
    assert run.returncode == 2
    assert run.last_stderr_line.startswith("calcx-agent: failure: bad_environment ")
    assert "AGL_KEY" in run.last_stderr_line
