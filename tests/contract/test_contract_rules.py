"""The contract's tables, lines and env rule agree with themselves: what one side prints or
refuses, the other side reads or refuses the same way."""

from __future__ import annotations

import pytest

from calcx.contract.env import (
    AGL_KEY,
    CALCX_KEY,
    DEFAULT_ENV_MAP,
    MAX_ENV_BYTES,
    REQUIRED_ROW_VARIABLES,
    REQUIRED_VARIABLES,
    agent_base_env,
    agent_inherits,
    env_problem,
    rollout_env_map,
    unmapped_variables,
)
from calcx.contract.failures import (
    EXIT_CODES,
    EXIT_OK,
    FAILURE_REASONS,
    FailureReason,
    failure_line,
    parse_failure_line,
    reason_from_agent_exit,
)
from calcx.contract.ready import (
    CONTROLLER_READY,
    SERVER_READY,
    STUB_LLM_READY,
    controller_ready_line,
    server_ready_line,
    stub_llm_ready_line,
)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("QUESTION", "2+3\x00", "NUL"),
        ("QUESTION", "bad \ud800 surrogate", "not valid Unicode"),
        ("QUESTION", "x" * MAX_ENV_BYTES, "Linux limits one variable"),
        ("QUESTION", 7, "must be a string"),
        ("", "x", "non-empty"),
        ("A=B", "x", "'=' or a NUL"),
        # a process environment could hold these names; a Kubernetes Job cannot
        ("MY VAR", "x", "not a valid C identifier-like name"),
        ("1ST", "x", "not a valid C identifier-like name"),
        ("QUESTION\n", "x", "not a valid C identifier-like name"),
    ],
)
def test_env_rule_refuses_what_either_runner_cannot_carry(name: object, value: object, message: str) -> None:
    problem = env_problem(name, value)
    assert problem is not None and message in problem


@pytest.mark.parametrize(
    "value",
    ['"}], {{ 7*7 }} $(id)\n---\nkind: Secret', "Ω 😀 \u2028 \t\r\n", "", "x" * (MAX_ENV_BYTES - len("QUESTION") - 1)],
)
def test_env_rule_accepts_hostile_text_a_process_can_carry(value: str) -> None:
    assert env_problem("QUESTION", value) is None
    assert all(env_problem(name, "v") is None for name in REQUIRED_VARIABLES)


def test_only_a_missing_env_map_means_the_default_one() -> None:
    """The server checks a rollout's row at create and builds its claim through the same map: an
    empty one stays empty (and is refused for leaving out what the agent needs)."""
    assert rollout_env_map(None) == DEFAULT_ENV_MAP and unmapped_variables(DEFAULT_ENV_MAP) == []
    assert rollout_env_map({}) == {} and unmapped_variables({}) == list(REQUIRED_ROW_VARIABLES)


@pytest.mark.parametrize("reason", sorted(EXIT_CODES))
def test_failure_line_and_exit_code_name_the_same_reason(reason: FailureReason) -> None:
    assert reason in FAILURE_REASONS and EXIT_CODES[reason] != EXIT_OK
    line = failure_line(reason, "what went wrong,\nover two lines")
    assert "\n" not in line
    assert parse_failure_line(f"noise\n{line}\n") == reason
    assert reason_from_agent_exit(EXIT_CODES[reason], None) == reason
    assert reason_from_agent_exit(99, f"earlier\n{line}") == reason


def test_failure_line_detail_is_bounded() -> None:
    assert len(failure_line(FailureReason.CRASH, "x" * 10_000)) < 600


def test_ready_lines_match_their_patterns() -> None:
    url = "http://127.0.0.1:8123"
    server = SERVER_READY.search(server_ready_line(url, "http://public:8123", "calcx.db"))
    assert server is not None and server.group(1) == url
    stub = STUB_LLM_READY.search(stub_llm_ready_line(f"{url}/v1", "normal", 3))
    assert stub is not None and stub.group(1) == f"{url}/v1"
    assert CONTROLLER_READY.search(controller_ready_line("local"))
    assert not STUB_LLM_READY.search(server_ready_line(url, url, "db"))


def test_an_agent_inherits_what_python_needs_and_no_secret() -> None:
    runner_env = {
        "PATH": "/bin",
        "HOME": "/h",
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "TMPDIR": "/t",
        "PYTHONPATH": "/src",
        "PEX_ROOT": "/p",
        "__PEX_EXTRA_SYS_PATH__": "src/python",
        "CALCX_CALCULATOR_TIMEOUT_S": "5",
        "CALCX_AGENT_TOOL_ROUNDS": "3",
        "CALCX_AGENT_PROMPT": "plain",
        "CALCX_KEY": "s" * 40,
        "CALCX_SERVER": "http://x",
        "WANDB_API_KEY": "w",
        "HF_TOKEN": "h",
        "AWS_SECRET_ACCESS_KEY": "a",
        "HTTPS_PROXY": "http://user:pw@proxy",
        "AGL_KEY": "stale",
    }
    kept = agent_base_env(runner_env)
    assert set(kept) == {
        "PATH",
        "HOME",
        "LANG",
        "LC_ALL",
        "TMPDIR",
        "PYTHONPATH",
        "PEX_ROOT",
        "__PEX_EXTRA_SYS_PATH__",
        "CALCX_CALCULATOR_TIMEOUT_S",
        "CALCX_AGENT_TOOL_ROUNDS",
        "CALCX_AGENT_PROMPT",
    }
    assert not any(agent_inherits(name) for name in (CALCX_KEY, AGL_KEY))
