"""The calculator's bounds: bombs the model writes get a tool error in well under a second, the
calculator keeps answering, its process runs under rlimits, and answers within the bounds are
the package's own.

Real processes: the MCP calculator (`python -m calcx.agent.calculator`) over stdio with MCP's client.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp_server_calculator.calculator import evaluate as package_evaluate

from calcx.agent.calculator import calculator_environment
from calcx.agent.calculator_limits import (
    CALCULATOR_CPU_S,
    CALCULATOR_MEMORY_BYTES,
    MAX_EXPRESSION_CHARS,
    MAX_RESULT_DIGITS,
    CalculatorLimit,
    bounded_evaluate,
    time_limit_message,
)

#: What a model (or an attacker writing the question) can send: each would take gigabytes or
#: minutes without the bounds.
BOMBS = {
    "'9'*10**8": "more than 1000 digits",
    "10**10**10": "more than 1000 digits",
    "9**9**9": "more than 1000 digits",
    "2**20000": "more than 1000 digits",
    "factorial(10**6)": "factorial takes arguments up to",
    "comb(10**7, 5*10**6)": "comb takes arguments up to",
    "'ab' * 400 + 'c' * 300": "more than 1000 digits",
    "1+" * 600 + "1": "characters; the calculator takes at most",
    # one step that would build 2 GB in seconds before its result's size is seen
    "'%2147483647d' % 1": "does not format strings",
    "b'%.2147483646f' % 1.0": "does not format strings",
}
WITHIN = [
    "2 + 3 * 4",
    "90 * (1 - 2/3)",
    "-5 // 2",
    "2^10",
    "3 × 4 ÷ 6",
    "sqrt(16)",
    "pi * 2",
    "2**3000",
    "factorial(400)",
    "'a' * 1000",
    "1e308 * 10",
    "(-3)**5",
    "10**-3",
]


@pytest.mark.parametrize("expression", list(BOMBS))
def test_a_bomb_is_refused_at_once(expression: str) -> None:
    started = time.monotonic()
    with pytest.raises(CalculatorLimit, match=BOMBS[expression]):
        bounded_evaluate(expression)
    assert time.monotonic() - started < 0.5


def test_within_the_bounds_the_answers_are_the_packages() -> None:
    for expression in WITHIN:
        assert bounded_evaluate(expression) == package_evaluate(expression), expression
    assert len(bounded_evaluate("9**1047")) == MAX_RESULT_DIGITS  # the largest result still answered
    assert bounded_evaluate("+".join(["1"] * (MAX_EXPRESSION_CHARS // 2))) == str(MAX_EXPRESSION_CHARS // 2)
    for bad, message in (("x + 1", "Unknown identifier: x"), ("3 > 2", "Unsupported operation")):
        with pytest.raises(ValueError, match=message):
            bounded_evaluate(bad)


def test_the_time_bound_is_checked_at_every_step() -> None:
    # every step within the bounds is quick, so the bound is shown with none left to spend
    with pytest.raises(CalculatorLimit, match=time_limit_message(0)):
        bounded_evaluate("2 + 3", max_call_s=0)
    with pytest.raises(CalculatorLimit, match="took longer than"):
        bounded_evaluate("+".join(["1"] * 400), max_call_s=0)
    assert bounded_evaluate("2 + 3", max_call_s=60) == "5"


def test_percent_stays_arithmetic() -> None:
    assert bounded_evaluate("17 % 5") == package_evaluate("17 % 5") == "2"
    assert bounded_evaluate("7.5 % 2") == package_evaluate("7.5 % 2")
    with pytest.raises(CalculatorLimit, match="does not format strings"):
        bounded_evaluate("'%d' % 5")


async def _ask(expressions: list[str]) -> list[tuple[str, bool, float]]:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "calcx.agent.calculator"], env=calculator_environment()
    )
    out = []
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        for expression in expressions:
            started = time.monotonic()
            result = await session.call_tool("calculate", {"expression": expression})
            text = "\n".join(getattr(c, "text", "") for c in result.content)
            out.append((text, bool(result.isError), time.monotonic() - started))
    return out


def test_the_mcp_calculator_answers_a_bomb_with_a_tool_error_and_keeps_serving() -> None:
    bombs = list(BOMBS)
    answers = asyncio.run(asyncio.wait_for(_ask(bombs + ["2 + 3"]), 60))
    for expression, (text, is_error, seconds) in zip(bombs, answers):
        assert is_error and text.startswith("Error executing tool calculate: ") and BOMBS[expression] in text, text
        assert seconds < 2.0, (expression, seconds)
    assert answers[-1][:2] == ("5", False)


def test_the_calculator_process_runs_under_rlimits() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "calcx.agent.calculator"],
        env=calculator_environment(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        hello = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2024-11-05",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "0"},
            },
        }
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write((json.dumps(hello) + "\n").encode())
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["id"] == 1  # serving: past its limits' setup
        limits = open(f"/proc/{proc.pid}/limits").read()
    finally:
        proc.kill()
        proc.wait(10)
    rows = {line[:26].strip(): line[26:].split() for line in limits.splitlines()[1:]}
    assert rows["Max address space"][0] == str(CALCULATOR_MEMORY_BYTES)
    assert rows["Max cpu time"][0] == str(CALCULATOR_CPU_S)
