"""Build-time self-test of the agent image: the MCP calculator the agent uses must start over
stdio, list its `calculate` tool and compute 2+3 = 5. Any failure exits non-zero, which fails
`docker build`. Runs offline as the image's non-root user.
"""

from __future__ import annotations

import asyncio
import sys

TIMEOUT_S = 60.0


async def _check() -> str:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    from calcx.agent.calculator import calculator_command, calculator_environment

    command = calculator_command({})
    params = StdioServerParameters(command=command[0], args=command[1:], env=calculator_environment())
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = [tool.name for tool in (await session.list_tools()).tools]
            if "calculate" not in tools:
                raise RuntimeError(f"calculator lists tools {tools}, expected 'calculate'")
            result = await session.call_tool("calculate", {"expression": "2+3"})
            if result.isError:
                raise RuntimeError(f"calculate('2+3') returned an error: {result.content}")
            text = "".join(getattr(part, "text", "") for part in result.content).strip()
            if text != "5":
                raise RuntimeError(f"calculate('2+3') returned {text!r}, expected '5'")
            return f"calculator {command} tools={tools} calculate('2+3')={text}"


def main() -> int:
    try:
        summary = asyncio.run(asyncio.wait_for(_check(), TIMEOUT_S))
    except BaseException as exc:  # noqa: BLE001 - any failure must fail the image build
        print(f"agent image self-test FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"agent image self-test ok: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
