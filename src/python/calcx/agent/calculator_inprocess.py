"""The MCP calculator without the MCP server: what the agent's model is shown and told.

The agent reaches `mcp_server_calculator` over stdio (calcx.agent.calculator). Here the same
package's FastMCP server answers in this process, through the request handlers its stdio
transport calls, within the agent's calculator's bounds (calcx.agent.calculator_limits), so
evaluation, result text and error text are the server's own ("Error executing tool calculate:
division by zero"). The tool entry is the one the agent's OpenAI request carries:
AutoGen's McpWorkbench keeps the MCP schema's properties and required list and adds
`additionalProperties` (false unless the schema sets it), and its OpenAI client wraps that with
`strict: false`; key order included, since a chat template prints the entry as JSON. Used where
the calculator's answers are needed without an agent: the anchor's verl tool (calcx.anchor.tool)
and the data commands' traces and hard split (calcx.data.traces, calcx.data.hard).

The calls themselves are evaluated in a child process (`python -m calcx.agent.calculator_inprocess`,
one per process that calls, started on first use), under the agent's calculator's rlimits
(`limit_process`), never on the caller's event loop: a step that runs long would otherwise stall
every trajectory of verl's agent-loop worker. A call not answered within `CALL_KILL_S` ends that
process (the next call starts another) and is answered with the calculator's time-limit error.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from mcp import types
from mcp_server_calculator.calculator import mcp as CALCULATOR_SERVER

from calcx.agent.calculator import isolated_calculator_environment
from calcx.agent.calculator_limits import CALL_KILL_S, install, limit_process, time_limit_message

install()  # the agent's bounds (expression length, result size, time per call) hold here too

#: What the child prints once it serves (imports done, rlimits set).
READY = b"calcx-calculator-inprocess: ready\n"
#: How long a starting child may take to import the calculator before it is given up.
START_TIMEOUT_S = 60.0


def _handler(request_type: type) -> Any:
    # the low-level server behind FastMCP: the handlers its stdio session dispatches to
    return CALCULATOR_SERVER._mcp_server.request_handlers[request_type]


async def list_tools() -> list[types.Tool]:
    """The tools the server lists, as an MCP client receives them."""
    result = await _handler(types.ListToolsRequest)(types.ListToolsRequest(method="tools/list"))
    return list(result.root.tools)


async def _call_here(name: str, arguments: Mapping[str, Any] | None) -> tuple[str, bool]:
    """(text, is_error) of one tool call in this process, as the agent's workbench turns the
    server's answer into the tool message: the text parts joined by newlines, non-text parts as
    their JSON."""
    request = types.CallToolRequest(
        method="tools/call", params=types.CallToolRequestParams(name=name, arguments=dict(arguments or {}))
    )
    result = (await _handler(types.CallToolRequest)(request)).root
    parts = [c.text if isinstance(c, types.TextContent) else c.model_dump_json() for c in result.content]
    return "\n".join(parts), bool(result.isError)


def _tool_error(name: str, message: str) -> tuple[str, bool]:
    # FastMCP's own wording for a tool that raised (what the agent's calculator answers)
    return f"Error executing tool {name}: {message}", True


class CalculatorProcess:
    """The child that evaluates calls; thread-safe, one call at a time. Ended by `close` (and at
    exit); a child whose call runs past ``kill_after_s`` is killed and the next call starts another."""

    def __init__(self, kill_after_s: float = CALL_KILL_S) -> None:
        self.kill_after_s = kill_after_s
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._pending = b""

    @property
    def pid(self) -> int | None:
        """The running child's process id (None before the first call and after a kill)."""
        return None if self._proc is None else self._proc.pid

    def _read_line(self, proc: subprocess.Popen[bytes], timeout_s: float) -> bytes | None:
        """One line from the child, or None at its end or once ``timeout_s`` has passed."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return line + b"\n"

    def _end(self) -> None:
        proc, self._proc, self._pending = self._proc, None, b""
        if proc is not None:
            proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()

    def _running(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            self._end()
            proc = subprocess.Popen(
                [sys.executable, "-m", "calcx.agent.calculator_inprocess"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=isolated_calculator_environment(),
            )
            self._proc = proc
            if self._read_line(proc, START_TIMEOUT_S) != READY:
                self._end()
                raise RuntimeError(f"the calculator process did not start within {START_TIMEOUT_S:g} s")
        return self._proc

    def call(self, name: str, arguments: Mapping[str, Any] | None) -> tuple[str, bool]:
        """(text, is_error) of one tool call, evaluated in the child."""
        request = json.dumps({"name": name, "arguments": dict(arguments or {})}).encode() + b"\n"
        with self._lock:
            proc = self._running()
            assert proc.stdin is not None
            try:
                proc.stdin.write(request)
                proc.stdin.flush()
            except BrokenPipeError:
                line = None
            else:
                line = self._read_line(proc, self.kill_after_s)
            if line is None:
                ended = proc.poll()
                self._end()
                if ended is None:  # still evaluating: one step past every bound
                    return _tool_error(name, time_limit_message(self.kill_after_s))
                return _tool_error(name, f"the calculator process ended (status {ended})")
            answer = json.loads(line)
            return str(answer["text"]), bool(answer["is_error"])

    def close(self) -> None:
        with self._lock:
            self._end()


_PROCESS = CalculatorProcess()
atexit.register(_PROCESS.close)


async def call(
    name: str, arguments: Mapping[str, Any] | None, process: CalculatorProcess | None = None
) -> tuple[str, bool]:
    """(text, is_error) of one tool call, as the agent's MCP calculator answers it, evaluated in
    the calculator process (this process's own unless ``process`` is given) on a thread, so the
    caller's event loop runs on meanwhile."""
    return await asyncio.to_thread((process or _PROCESS).call, name, arguments)


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


def serve() -> int:
    """The child: one JSON request a line on stdin, one answer a line on stdout, until stdin ends."""
    limit_process()  # the agent's calculator's rlimits: address space and CPU time
    logging.getLogger().setLevel(logging.WARNING)
    loop = asyncio.new_event_loop()
    out = sys.stdout.buffer
    out.write(READY)
    out.flush()
    for line in sys.stdin.buffer:
        request = json.loads(line)
        text, is_error = loop.run_until_complete(_call_here(request["name"], request["arguments"]))
        out.write(json.dumps({"text": text, "is_error": is_error}).encode() + b"\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(serve())
