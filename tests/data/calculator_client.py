"""The agent's real MCP calculator (`python -m calcx.agent.calculator`), spoken to over stdio with
MCP's own client: the reference the data tests check calculator answers against."""

from __future__ import annotations

import sys

from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

from calcx.agent.calculator import calculator_environment


async def calculator_answers(expressions: list[str]) -> list[str]:
    """What the agent's MCP calculator answers for each expression (each must be answered, not refused)."""
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "calcx.agent.calculator"], env=calculator_environment()
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        answers = [await session.call_tool("calculate", {"expression": e}) for e in expressions]
    texts = []
    for answer in answers:
        assert not answer.isError, answer
        texts.append("\n".join(c.text for c in answer.content if isinstance(c, types.TextContent)))
    return texts
