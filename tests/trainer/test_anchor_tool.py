"""The anchor's verl tool answers as the agent's MCP calculator does, and shows the same schema.

The reference is the real thing: the calculator the agent starts (`python -m
calcx.agent.calculator`, over stdio) under the `calcx` PEX's interpreter, spoken to with MCP's own
client; and, for the arithmetic, `mcp_server_calculator`'s own `evaluate`. The tool under test is
what verl builds from the anchor's tool config (`initialize_tools_from_config`).
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from live_stack import SERVICES_PYTHON, needs_services
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp_server_calculator.calculator import evaluate

from calcx.agent.calculator_inprocess import calculator_tool_entry, openai_tool
from calcx.agent.calculator_limits import bounded_evaluate
from calcx.anchor.config import TOOLS_FILE
from calcx.trainer.run.services import CALCX_SRC

# arithmetic the model writes, including what the calculator refuses
EXPRESSIONS = [
    "2 + 3 * 4",
    "7 * 12 + 5",
    "90 * (1 - 2/3)",
    "10 / 4",
    "-5 // 2",
    "17 % 5",
    "2^10",
    "3 × 4 ÷ 6",
    "sqrt(16)",
    "round(2.675, 2)",
    "pi * 2",
    "1e308 * 10",
    "0.1 + 0.2",
    "1/0",
    "7 % 0",
    "2 +",
    "(1",
    "",
    "x + 1",
    "3 > 2",
    "[1, 2]",
    "2**20000",
    "factorial(-1)",
    "'a' + 'b'",
]
# arguments the model gets wrong
BAD_ARGUMENTS: list[dict[str, object]] = [
    {},
    {"expression": 5},
    {"expr": "1 + 1"},
    {"expression": "1 + 1", "extra": True},
]


def _verl_tool():
    from verl.tools.tool_registry import initialize_tools_from_config

    tools = initialize_tools_from_config(str(TOOLS_FILE))
    assert len(tools) == 1
    return tools[0]


async def _server_answers(calls: list[dict]) -> tuple[list[types.Tool], list[types.CallToolResult]]:
    """The agent's calculator command, with MCP's client over stdio."""
    params = StdioServerParameters(
        command=SERVICES_PYTHON, args=["-m", "calcx.agent.calculator"], env={**os.environ, "PYTHONPATH": str(CALCX_SRC)}
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        listed = (await session.list_tools()).tools
        answers = [await session.call_tool(listed[0].name, arguments) for arguments in calls]
    return listed, answers


def _text(result: types.CallToolResult) -> str:
    return "\n".join(c.text if isinstance(c, types.TextContent) else c.model_dump_json() for c in result.content)


async def _tool_answers(tool, calls: list[dict]) -> list[tuple[str, bool]]:
    out = []
    for arguments in calls:
        response, reward, metrics = await tool.execute("instance", arguments)
        assert reward == 0.0
        out.append((response.text, metrics["is_error"]))
    return out


@needs_services
def test_tool_answers_exactly_as_the_agents_calculator_over_stdio() -> None:
    calls = [{"expression": e} for e in EXPRESSIONS] + BAD_ARGUMENTS
    listed, answers = asyncio.run(_server_answers(calls))
    tool = _verl_tool()
    ours = asyncio.run(_tool_answers(tool, calls))
    for arguments, answer, (text, is_error) in zip(calls, answers, ours):
        assert (text, is_error) == (_text(answer), bool(answer.isError)), arguments
    # the set covers results and every kind of refusal the model meets
    errors = [text for text, is_error in ours if is_error]
    assert "Error executing tool calculate: division by zero" in errors
    assert any("invalid syntax" in t or "was never closed" in t for t in errors)
    assert any("Unknown identifier: x" in t for t in errors)
    assert any("validation error" in t for t in errors)
    assert len(errors) == 10 + len(BAD_ARGUMENTS)
    # the name the model calls and the schema it is shown: the server's
    assert [t.name for t in listed] == [tool.name] == ["calculate"]
    assert tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True) == openai_tool(listed[0])


def test_arithmetic_is_the_packages_own_evaluate_within_the_agents_bounds() -> None:
    assert evaluate is not bounded_evaluate  # the package's own, imported before the anchor installed the bounds
    tool = _verl_tool()
    for expression, (text, is_error) in zip(
        EXPRESSIONS, asyncio.run(_tool_answers(tool, [{"expression": e} for e in EXPRESSIONS]))
    ):
        try:
            expected, failed = bounded_evaluate(expression), False
        except Exception as exc:  # noqa: BLE001 - whatever evaluate raises is the calculator's answer
            expected, failed = f"Error executing tool calculate: {exc}", True
        assert (text, is_error) == (expected, failed), expression
        if expression != "2**20000":  # past the bounds: refused before the package would compute it
            try:
                assert evaluate(expression) == text and not is_error, expression
            except Exception as exc:  # noqa: BLE001 - the package refuses it too, with the same text
                assert text == f"Error executing tool calculate: {exc}", expression
    assert "more than 1000 digits" in asyncio.run(_tool_answers(tool, [{"expression": "9**9**9"}]))[0][0]


def test_verl_renders_the_schema_the_agent_sends_key_for_key() -> None:
    """verl's ToolAgentLoop puts `tool_schema.model_dump(exclude_unset=True, exclude_none=True)`
    into the chat template; its own schema models would drop `title` and `additionalProperties`."""
    from verl.tools.schemas import OpenAIFunctionToolSchema

    tool = _verl_tool()
    entry = calculator_tool_entry()
    dumped = tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True)
    assert json.dumps(dumped) == json.dumps(entry)  # same keys in the same order, as a template prints them
    assert entry["function"]["parameters"] == {
        "type": "object",
        "properties": {"expression": {"title": "Expression", "type": "string"}},
        "required": ["expression"],
        "additionalProperties": False,
    }
    assert entry["function"]["strict"] is False
    assert isinstance(tool.tool_schema, OpenAIFunctionToolSchema) and tool.tool_schema.function.name == "calculate"
    plain = OpenAIFunctionToolSchema.model_validate(entry).model_dump(exclude_unset=True, exclude_none=True)
    assert plain != entry  # what verl's own type would have shown the model


def test_a_schema_in_the_tool_config_is_refused(tmp_path) -> None:
    from verl.tools.tool_registry import initialize_tools_from_config

    config = tmp_path / "tools.yaml"
    config.write_text(
        TOOLS_FILE.read_text() + "    tool_schema:\n      type: function\n      function:\n"
        "        name: calculate\n        description: other\n"
    )
    with pytest.raises(ValueError, match="mcp_server_calculator"):
        initialize_tools_from_config(str(config))
