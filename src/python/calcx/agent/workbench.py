"""An MCP workbench that tells a broken calculator from a bad tool call.

AutoGen's ``McpWorkbench.call_tool`` turns every exception into an error result
that goes back to the model, so a dead or hung calculator would look like a
wrong answer. This subclass raises :class:`CalculatorFailed` for transport
failures (process exited, pipe closed, request timed out) and keeps returning
error results for the model's own mistakes (bad arguments, unknown tool).
"""

from __future__ import annotations

from typing import Any, List, Mapping

import anyio
from autogen_core import CancellationToken
from autogen_core.tools import ImageResultContent, TextResultContent, ToolResult, ToolSchema
from autogen_ext.tools.mcp import McpWorkbench
from mcp.shared.exceptions import McpError
from mcp.types import CONNECTION_CLOSED, CallToolResult, TextContent

from calcx.agent.failures import CalculatorFailed

_TRANSPORT_ERRORS = (
    anyio.ClosedResourceError,
    anyio.BrokenResourceError,
    anyio.EndOfStream,
    BrokenPipeError,
    ConnectionError,
    EOFError,
    OSError,
    TimeoutError,
)
_REQUEST_TIMEOUT = 408


def transport_failure(exc: BaseException) -> str | None:
    """A description when ``exc`` means the calculator itself failed, else None."""
    if isinstance(exc, McpError):
        code = getattr(exc.error, "code", None)
        if code == _REQUEST_TIMEOUT:
            return f"calculator did not answer in time: {exc}"
        if code == CONNECTION_CLOSED:
            return f"calculator connection closed (process exited?): {exc}"
        return None
    if isinstance(exc, _TRANSPORT_ERRORS):
        return f"calculator transport failed: {type(exc).__name__}: {exc}"
    if isinstance(exc, RuntimeError) and "actor" in str(exc).lower():
        return f"calculator session is not running: {exc}"
    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            found = transport_failure(sub)
            if found:
                return found
    return None


class CalculatorWorkbench(McpWorkbench):
    """McpWorkbench whose transport failures raise CalculatorFailed."""

    failure: CalculatorFailed | None = None

    def _fail(self, detail: str) -> CalculatorFailed:
        if self.failure is None:
            self.failure = CalculatorFailed(detail)
        return self.failure

    async def list_tools(self) -> List[ToolSchema]:
        if self.failure is not None:
            raise self.failure
        try:
            return await super().list_tools()
        except Exception as exc:
            detail = transport_failure(exc) or f"listing calculator tools failed: {type(exc).__name__}: {exc}"
            raise self._fail(detail) from exc

    async def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        cancellation_token: CancellationToken | None = None,
        call_id: str | None = None,
    ) -> ToolResult:
        if self.failure is not None:
            raise self.failure
        if self._actor is None:
            raise self._fail("calculator session is not running")
        cancellation_token = cancellation_token or CancellationToken()
        try:
            future = await self._actor.call("call_tool", {"name": name, "kargs": arguments or {}})
            cancellation_token.link_future(future)
            result = await future
        except Exception as exc:
            detail = transport_failure(exc)
            if detail is not None:
                raise self._fail(detail) from exc
            return ToolResult(name=name, result=[TextResultContent(content=f"Error: {exc}")], is_error=True)
        if not isinstance(result, CallToolResult):
            raise self._fail(f"calculator answered with {type(result).__name__}, not a tool result")
        parts: list[TextResultContent | ImageResultContent] = []
        for content in result.content:
            if isinstance(content, TextContent):
                parts.append(TextResultContent(content=content.text))
            else:
                parts.append(TextResultContent(content=content.model_dump_json()))
        return ToolResult(name=name, result=parts, is_error=bool(result.isError))
