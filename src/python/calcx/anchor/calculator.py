"""The MCP calculator, in-process: what the agent's model is shown and told, without the MCP server.

The agent reaches `mcp_server_calculator` over stdio (calcx.agent.calculator). Here the same
package's FastMCP server answers in this process, through the request handlers its stdio
transport calls, within the agent's calculator's bounds (calcx.agent.calculator_limits), so
evaluation, result text and error text are the server's own ("Error executing tool calculate:
division by zero"). The tool entry is the one the agent's OpenAI request carries:
AutoGen's McpWorkbench keeps the MCP schema's properties and required list and adds
`additionalProperties` (false unless the schema sets it), and its OpenAI client wraps that with
`strict: false`; key order included, since a chat template prints the entry as JSON.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, Mapping

from mcp import types
from mcp_server_calculator.calculator import mcp as CALCULATOR_SERVER

from calcx.agent.calculator_limits import install

install()  # the agent's bounds (expression length, result size, time per call) hold here too


def _handler(request_type: type) -> Any:
    # the low-level server behind FastMCP: the handlers its stdio session dispatches to
    return CALCULATOR_SERVER._mcp_server.request_handlers[request_type]


async def list_tools() -> list[types.Tool]:
    """The tools the server lists, as an MCP client receives them."""
    result = await _handler(types.ListToolsRequest)(types.ListToolsRequest(method="tools/list"))
    return list(result.root.tools)


async def call(name: str, arguments: Mapping[str, Any] | None) -> tuple[str, bool]:
    """(text, is_error) of one tool call, as the agent's workbench turns the server's answer into
    the tool message: the text parts joined by newlines, non-text parts as their JSON."""
    request = types.CallToolRequest(
        method="tools/call", params=types.CallToolRequestParams(name=name, arguments=dict(arguments or {})))
    result = (await _handler(types.CallToolRequest)(request)).root
    parts = [c.text if isinstance(c, types.TextContent) else c.model_dump_json() for c in result.content]
    return "\n".join(parts), bool(result.isError)


def openai_tool(tool: types.Tool) -> dict[str, Any]:
    """The chat-completions `tools` entry the agent sends for an MCP tool."""
    schema = tool.inputSchema
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description or "",
            "parameters": {
                "type": "object",
                "properties": schema.get("properties", {}),
                "required": schema.get("required", []),
                "additionalProperties": schema.get("additionalProperties", False),
            },
            "strict": False,
        },
    }


def calculator_tool_entry() -> dict[str, Any]:
    """The `tools` entry of the server's one tool (its name is the server's: `calculate`); callable
    with or without a running event loop (verl builds its tools in constructors)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        tools = pool.submit(asyncio.run, list_tools()).result()
    if len(tools) != 1:
        raise LookupError(f"mcp_server_calculator lists {len(tools)} tools, not one: {[t.name for t in tools]}")
    return openai_tool(tools[0])
