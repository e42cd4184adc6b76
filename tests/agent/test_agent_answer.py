"""Answer extraction, the task prompt and environment validation."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time

import pytest

from calcx.agent.answer import INSTRUCTION, build_task, extract_answer
from calcx.agent.calculator import calculator_command, calculator_environment
from calcx.agent.config import AgentConfig
from calcx.agent.failures import BadEnvironment, CalculatorFailed
from calcx.contract.failures import EXIT_CODES, FailureReason

GOOD_ENV = {
    "QUESTION": "What is 2 + 2?",
    "RESULT": "4",
    "AGL_OPENAI_BASE_URL": "http://127.0.0.1:1/v1",
    "AGL_EVENT_URL": "http://127.0.0.1:1/events",
    "AGL_KEY": "k",
}


@pytest.mark.parametrize(
    "message, answer",
    [
        ("The total is 12. ### ANSWER: 12 ###", "12"),
        ("### ANSWER:12###", "12"),
        ("reasoning\n### ANSWER: 2/3", "2/3"),
        ("### ANSWER: C ### trailing text", "C"),
        ("no marker, just 7", "no marker, just 7"),
        ("", ""),
        (None, ""),
    ],
)
def test_extract_answer(message, answer):
    assert extract_answer(message) == answer


@pytest.mark.parametrize(
    "message",
    ["### ANSWER: " + " " * 5_000_000 + "x", "###" * 2_000_000, "### ANSWER: 1" + " \t" * 3_000_000],
)
def test_extract_answer_is_fast_on_adversarial_text(message):
    # linear time: ~50 ms here for 6-15 MB; a backtracking regex would not return at all, so the
    # ceiling (30 s, hundreds of times the typical figure) only tells a hang from a slow machine
    started = time.monotonic()
    extract_answer(message)
    assert time.monotonic() - started < 30.0


def test_task_contains_question_and_format_instruction():
    task = build_task("  What is 2 + 2?  ")
    assert task.startswith("What is 2 + 2?\n\n") and task.endswith(INSTRUCTION)
    assert "### ANSWER: <answer> ###" in task


@pytest.mark.parametrize("missing", ["QUESTION", "RESULT", "AGL_OPENAI_BASE_URL", "AGL_EVENT_URL", "AGL_KEY"])
def test_missing_variable_is_named(missing):
    env = {k: v for k, v in GOOD_ENV.items() if k != missing}
    with pytest.raises(BadEnvironment, match=missing) as info:
        AgentConfig.from_env(env)
    assert info.value.exit_code == EXIT_CODES[FailureReason.BAD_ENVIRONMENT] == 2


@pytest.mark.parametrize(
    "extra, fragment",
    [
        ({"AGL_EVENT_URL": "ftp://x"}, "AGL_EVENT_URL"),
        ({"CALCX_AGENT_TIMEOUT_S": "soon"}, "CALCX_AGENT_TIMEOUT_S"),
        ({"CALCX_AGENT_TIMEOUT_S": "-1"}, "CALCX_AGENT_TIMEOUT_S"),
        ({"CALCX_CALCULATOR_CMD": "python -m calc"}, "CALCX_CALCULATOR_CMD"),
        ({"CALCX_CALCULATOR_CMD": "[]"}, "CALCX_CALCULATOR_CMD"),
        ({"CALCX_AGENT_TOOL_ROUNDS": "0"}, "CALCX_AGENT_TOOL_ROUNDS=0 is out of range"),
        ({"CALCX_AGENT_TOOL_ROUNDS": "17"}, "CALCX_AGENT_TOOL_ROUNDS=17 is out of range: 1 .* to 16"),
        ({"CALCX_AGENT_TOOL_ROUNDS": "2.5"}, "CALCX_AGENT_TOOL_ROUNDS must be a whole number"),
        ({"CALCX_AGENT_TOOL_ROUNDS": "-1"}, "CALCX_AGENT_TOOL_ROUNDS must be a whole number"),
        (
            {"CALCX_AGENT_PROMPT": "Plain"},
            "CALCX_AGENT_PROMPT must name one of the agent's system messages "
            r"\(plain, calculator-first, calculator-steps\), got 'Plain'",
        ),
        ({"RESULT_REL_TOL": "exact"}, "RESULT_REL_TOL must be a relative tolerance from 0 .* got 'exact'"),
        ({"RESULT_REL_TOL": "-0.1"}, "RESULT_REL_TOL must be a relative tolerance"),
        ({"RESULT_REL_TOL": "1"}, "RESULT_REL_TOL must be a relative tolerance"),
        ({"RESULT_REL_TOL": "nan"}, "RESULT_REL_TOL must be a relative tolerance"),
    ],
)
def test_bad_settings_are_named(extra, fragment):
    with pytest.raises(BadEnvironment, match=fragment):
        AgentConfig.from_env({**GOOD_ENV, **extra})


def test_config_defaults_and_bounds():
    config = AgentConfig.from_env(GOOD_ENV)
    assert config.run_timeout_s == 300 and config.model_max_retries == 6 and config.calculator_timeout_s == 120
    assert AgentConfig.from_env({**GOOD_ENV, "CALCX_AGENT_TIMEOUT_S": "9999"}).run_timeout_s == 300
    assert AgentConfig.from_env({**GOOD_ENV, "CALCX_AGENT_TIMEOUT_S": "5"}).run_timeout_s == 5
    assert config.tool_rounds == 1  # one round of calls, then the answer: AutoGen's own default
    assert AgentConfig.from_env({**GOOD_ENV, "CALCX_AGENT_TOOL_ROUNDS": " 16 "}).tool_rounds == 16
    assert config.prompt == "plain"
    assert AgentConfig.from_env({**GOOD_ENV, "CALCX_AGENT_PROMPT": " calculator-first "}).prompt == "calculator-first"
    assert config.rel_tol == 1e-2  # Calc-X's tolerance unless the row sets its own
    assert AgentConfig.from_env({**GOOD_ENV, "RESULT_REL_TOL": "1e-09"}).rel_tol == 1e-9
    assert AgentConfig.from_env({**GOOD_ENV, "RESULT_REL_TOL": "0"}).rel_tol == 0.0


@pytest.mark.parametrize("prompt", ["calculator-first", "calculator-steps"])
def test_each_system_message_ends_with_the_answer_format_and_a_calculator_one_shows_a_parsable_call(prompt):
    """Every system message asks for the format extract_answer reads; a calculator one shows a
    call the hermes parser reads (one JSON object, single braces, inside the tags) with the
    calculator's real tool name and argument, and an expression the calculator evaluates."""
    from calcx.agent.answer import SYSTEM_MESSAGES, prompt_messages
    from calcx.agent.calculator_inprocess import call as calculate
    from calcx.agent.workbench import CALCULATOR_TOOLS

    for text in SYSTEM_MESSAGES.values():
        assert text.endswith("### ANSWER: <answer> ###")
    shown = re.search(r"<tool_call>\n(.*)\n</tool_call>", SYSTEM_MESSAGES[prompt])
    assert shown is not None
    call = json.loads(shown.group(1))
    tool = CALCULATOR_TOOLS[0]
    assert call["name"] == tool["name"] and set(call["arguments"]) == set(tool["parameters"]["required"])
    text, is_error = asyncio.run(calculate(call["name"], call["arguments"]))
    assert not is_error and float(text) > 0, text
    system, user = prompt_messages("What is 2 + 2?", "calculator-first")
    assert system == {"role": "system", "content": SYSTEM_MESSAGES["calculator-first"]}
    assert user == prompt_messages("What is 2 + 2?")[1]  # the task is the same whichever the system message


def test_calculator_command_default_and_override():
    assert calculator_command({}) == [sys.executable, "-m", "calcx.agent.calculator"]
    override = ["/usr/bin/env", "calc-server", "--stdio"]
    assert calculator_command({"CALCX_CALCULATOR_CMD": json.dumps(override)}) == override


def test_calculator_environment_drops_secrets_and_the_rows_data():
    env = calculator_environment(
        {"AGL_KEY": "secret", "QUESTION": "q", "RESULT": "4", "RESULT_REL_TOL": "0", "PATH": "/bin"}
    )
    assert env.keys().isdisjoint({"AGL_KEY", "QUESTION", "RESULT", "RESULT_REL_TOL"}) and env["PATH"] == "/bin"
    assert env["PYTHONPATH"]


def test_failure_line_is_one_line_with_reason():
    line = CalculatorFailed("process\nexited\twith 3").stderr_line()
    assert line == "calcx-agent: failure: calculator_failed process exited with 3"
