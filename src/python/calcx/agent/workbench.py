"""An MCP workbench that tells a broken calculator from a bad tool call.

AutoGen's ``McpWorkbench.call_tool`` turns every exception into an error result
that goes back to the model, so a dead or hung calculator would look like a
wrong answer. This subclass treats transport failures (process exited, pipe
closed, request timed out) as :class:`CalculatorFailed` and keeps returning
error results for the model's own mistakes (bad arguments, unknown tool).

Two traps make a plain ``raise`` from ``call_tool`` not enough:

- AutoGen runs tool calls in a task of their own and waits for that task's
  results on a queue it fills only on success: an exception raised there never
  reaches ``agent.run``, which then waits forever. So the agent runs under
  :meth:`CalculatorWorkbench.guard`: a tool call that finds the calculator
  broken records the failure and waits to be cancelled, and the guard cancels
  the run and raises the failure.
- The MCP stdio client does not fail a request sent after the calculator's
  stdout closed, and a killed calculator is otherwise noticed only at the read
  timeout. So the workbench watches the calculator process itself
  (:mod:`calcx.agent.process_watch`): its exit fails the run at once, a model
  call in flight included.

The first model call does not wait for the calculator: :meth:`CalculatorWorkbench.open_soon`
starts it in the background and, until it has listed its tools, the agent announces
:data:`CALCULATOR_TOOLS` (the ``calculate`` tool's fixed schema). A tool call waits for the start;
a calculator that cannot start, or that lists other tools, fails the run as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Mapping
from typing import Any, NoReturn, TypeVar

import anyio
from autogen_core import CancellationToken
from autogen_core.tools import ImageResultContent, TextResultContent, ToolResult, ToolSchema
from autogen_ext.tools.mcp import McpWorkbench
from mcp.shared.exceptions import McpError
from mcp.types import CONNECTION_CLOSED, CallToolResult, TextContent

from calcx.agent.failures import CalculatorFailed
from calcx.agent.process_watch import ProcessWatch, find_session_child

log = logging.getLogger(__name__)
T = TypeVar("T")

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

#: What the calculator's ``list_tools`` answers (checked against it once it has started).
CALCULATOR_TOOLS: list[ToolSchema] = [
    ToolSchema(
        name="calculate",
        description="Calculates/evaluates the given expression.",
        parameters={
            "type": "object",
            "properties": {"expression": {"title": "Expression", "type": "string"}},
            "required": ["expression"],
            "additionalProperties": False,
        },
    )
]


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
    """McpWorkbench whose transport failures, and its calculator's exit, fail the rollout."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.failure: CalculatorFailed | None = None
        self._failed: asyncio.Event | None = None
        self._watch: ProcessWatch | None = None
        self._guarded = False
        self._parked: set[asyncio.Task[Any]] = set()
        self._opening: asyncio.Task[list[ToolSchema]] | None = None

    # -- lifecycle --------------------------------------------------------------------------
    async def open(self) -> list[ToolSchema]:
        """Start the calculator, list its tools and watch its process; CalculatorFailed if it
        cannot start (the agent runs this in the background: :meth:`open_soon`)."""
        try:
            await self.start()
            tools = await self._until_failure(super().list_tools())
        except CalculatorFailed:
            raise
        except Exception as exc:
            raise self._fail(
                transport_failure(exc) or f"calculator did not start: {type(exc).__name__}: {exc}"
            ) from exc
        pid = find_session_child()
        if pid is None:
            log.debug("calculator process not found among the children; relying on transport errors")
        else:
            self._watch = ProcessWatch(pid, self._fail)
        return tools

    def open_soon(self) -> None:
        """Start :meth:`open` in the background, so that the first model call need not wait for
        the calculator; its failure wakes :meth:`guard` like any other calculator failure."""
        if self._opening is None:
            self._opening = asyncio.ensure_future(self._open_checked())
            self._opening.add_done_callback(_retrieve)

    async def _open_checked(self) -> list[ToolSchema]:
        tools = await self.open()
        if tools != CALCULATOR_TOOLS:
            raise self._fail(f"calculator lists tools {tools!r}, not the announced {CALCULATOR_TOOLS!r}")
        return tools

    async def opened(self) -> None:
        """Wait until the calculator started by :meth:`open_soon` is up; CalculatorFailed if not."""
        if self._opening is not None:
            await self._until_failure(asyncio.shield(self._opening))

    async def stop(self) -> None:
        """Stop the calculator at the end of a run. It keeps no state, so it is killed rather
        than left to shut its interpreter down after its stdin closes: the MCP client's wait for
        its exit (and so the agent's own exit) then takes no time."""
        self.unwatch(kill=True)  # stopping the calculator on purpose is not a failure
        await self.cancel_opening()
        await super().stop()

    async def cancel_opening(self) -> None:
        """Abandon a background start still under way (the run ended first)."""
        opening = self._opening
        if opening is not None and not opening.done():
            opening.cancel()
            await asyncio.wait({opening}, timeout=5.0)

    def unwatch(self, kill: bool = False) -> None:
        """Stop watching the calculator's process; ``kill``: kill it too (ProcessWatch.close)."""
        if self._watch is not None:
            self._watch.close(kill=kill)
            self._watch = None

    @property
    def calculator_pid(self) -> int | None:
        """The watched calculator process (the launcher, under the pre-forked runner)."""
        return self._watch.pid if self._watch is not None else None

    # -- failure handling -------------------------------------------------------------------
    def _failed_event(self) -> asyncio.Event:
        if self._failed is None:
            self._failed = asyncio.Event()
            if self.failure is not None:
                self._failed.set()
        return self._failed

    def _fail(self, detail: str) -> CalculatorFailed:
        """Record the first failure (later ones keep it) and wake the guard."""
        if self.failure is None:
            self.failure = CalculatorFailed(detail)
            self.unwatch()
            self._failed_event().set()
        return self.failure

    async def _give_up(self) -> NoReturn:
        """Inside a guarded run, wait to be cancelled by the guard (a raise here would be lost in
        AutoGen's tool task); outside one, raise the failure."""
        assert self.failure is not None
        task = asyncio.current_task()
        if not self._guarded or task is None:
            raise self.failure
        self._parked.add(task)
        await asyncio.get_running_loop().create_future()  # never resolved: the guard cancels us
        raise self.failure  # not reached

    async def _until_failure(self, awaitable: Awaitable[T]) -> T:
        """``await awaitable``, abandoned as soon as the calculator fails."""
        if self.failure is not None:
            await self._give_up()
        work = asyncio.ensure_future(awaitable)
        failed = asyncio.ensure_future(self._failed_event().wait())
        try:
            await asyncio.wait({work, failed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            failed.cancel()
            if not work.done():
                work.cancel()
        if self.failure is not None and (not work.done() or work.cancelled()):
            await self._give_up()
        return work.result()  # raises CancelledError when the call itself was cancelled

    async def guard(self, awaitable: Awaitable[T]) -> T:
        """Run ``awaitable`` (the agent); raise CalculatorFailed as soon as the calculator fails,
        cancelling the run and any tool call waiting on the dead calculator."""
        run = asyncio.ensure_future(awaitable)
        failed = asyncio.ensure_future(self._failed_event().wait())
        self._guarded = True
        try:
            await asyncio.wait({run, failed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._guarded = False
            failed.cancel()
            pending = [t for t in (run, *self._parked) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5.0)
            self._parked.clear()
        if self.failure is not None:
            if run.done() and not run.cancelled():
                run.exception()  # retrieved: the calculator failure is the outcome
            raise self.failure
        return run.result()

    # -- tools ------------------------------------------------------------------------------
    async def list_tools(self) -> list[ToolSchema]:
        if self._opening is not None:
            if self.failure is not None:
                await self._give_up()
            return list(CALCULATOR_TOOLS)  # the start checks the calculator lists exactly these
        try:
            return await self._until_failure(super().list_tools())
        except CalculatorFailed:
            raise
        except Exception as exc:
            self._fail(transport_failure(exc) or f"listing calculator tools failed: {type(exc).__name__}: {exc}")
            await self._give_up()

    async def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        cancellation_token: CancellationToken | None = None,
        call_id: str | None = None,
    ) -> ToolResult:
        if self.failure is not None:
            await self._give_up()
        await self.opened()
        if self._actor is None:
            self._fail("calculator session is not running")
            await self._give_up()
        cancellation_token = cancellation_token or CancellationToken()
        try:
            request = await self._until_failure(self._actor.call("call_tool", {"name": name, "kargs": arguments or {}}))
            call = asyncio.ensure_future(request)
            cancellation_token.link_future(call)
            result = await self._until_failure(call)
        except CalculatorFailed:
            raise
        except Exception as exc:
            detail = transport_failure(exc)
            if detail is None:
                return ToolResult(name=name, result=[TextResultContent(content=f"Error: {exc}")], is_error=True)
            self._fail(detail)
            await self._give_up()
        if not isinstance(result, CallToolResult):
            self._fail(f"calculator answered with {type(result).__name__}, not a tool result")
            await self._give_up()
        parts: list[TextResultContent | ImageResultContent] = []
        for content in result.content:
            if isinstance(content, TextContent):
                parts.append(TextResultContent(content=content.text))
            else:
                parts.append(TextResultContent(content=content.model_dump_json()))
        return ToolResult(name=name, result=parts, is_error=bool(result.isError))


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a background start's outcome as seen (its failure is recorded in ``failure``)."""
    if not task.cancelled():
        task.exception()
