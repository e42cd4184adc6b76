"""One rollout: AutoGen AssistantAgent + MCP calculator answer one question.

Kept apart from :mod:`calcx.agent.main` so that AutoGen is imported only once
the environment has been checked (a bad environment fails in milliseconds).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import openai
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.messages import TextMessage
from autogen_ext.models.openai import OpenAIChatCompletionClient
from autogen_ext.tools.mcp import StdioServerParams

from calcx.agent.answer import SYSTEM_MESSAGES, build_task
from calcx.agent.calculator import calculator_environment
from calcx.agent.config import AgentConfig
from calcx.agent.failures import AgentFailure, BadEnvironment, ModelUnreachable
from calcx.agent.workbench import CalculatorWorkbench
from calcx.api.client import tls_context
from calcx.contract.env import AGL_KEY
from calcx.contract.gateway import context_refused

log = logging.getLogger(__name__)
T = TypeVar("T")

MODEL_INFO: dict[str, Any] = {
    "vision": False,
    "function_calling": True,
    "json_output": False,
    "family": "unknown",
    "structured_output": False,
}
WORKBENCH_STOP_TIMEOUT_S = 10.0
# AutoGen raises this when the reflection turn returns tool calls instead of text:
# the model's fault, so the rollout finishes with no answer rather than failing.
_NO_TEXT_REFLECTION = "produced no valid text response"


def make_model_client(config: AgentConfig) -> OpenAIChatCompletionClient:
    return OpenAIChatCompletionClient(
        model="auto",
        base_url=config.base_url,
        api_key=config.key,
        max_retries=config.model_max_retries,
        model_info=MODEL_INFO,  # type: ignore[arg-type]
        # openai's own client, with the process's one TLS context instead of a fresh one (which
        # would load the CA bundle before the first model call, even over plain http); AutoGen
        # hands AsyncOpenAI's keyword arguments through but does not declare this one
        http_client=openai.DefaultAsyncHttpxClient(verify=tls_context(config.base_url)),  # type: ignore[call-arg]
    )


def make_workbench(config: AgentConfig) -> CalculatorWorkbench:
    command = list(config.calculator_command)
    params = StdioServerParams(
        command=command[0],
        args=command[1:],
        env=calculator_environment(),
        read_timeout_seconds=config.calculator_timeout_s,
    )
    return CalculatorWorkbench(server_params=params)


def classify_model_error(exc: BaseException, config: AgentConfig) -> AgentFailure | None:
    """The infrastructure failure an OpenAI client error stands for, if it is one."""
    retries = config.model_max_retries
    if isinstance(exc, openai.APIConnectionError):
        return ModelUnreachable(
            f"model endpoint {config.base_url} unreachable after {retries} retries: {type(exc).__name__}: {exc}"
        )
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        if status in (401, 403):
            return BadEnvironment(f"model endpoint {config.base_url} rejected {AGL_KEY} (HTTP {status}): {exc.message}")
        return ModelUnreachable(
            f"model endpoint {config.base_url} answered HTTP {status} (after {retries} retries where retryable): "
            f"{exc.message}"
        )
    if isinstance(exc, openai.APIError):
        return ModelUnreachable(f"model endpoint {config.base_url} returned an unusable response: {exc}")
    return None


def last_text(messages: list[Any]) -> str:
    """The content of the agent's final text message ('' when there is none)."""
    for message in reversed(messages):
        if isinstance(message, TextMessage) and message.source != "user":
            return message.content
    return ""


async def _stop_workbench(workbench: CalculatorWorkbench) -> None:
    try:
        await workbench.cancel_opening()
    except BaseException as exc:  # noqa: BLE001 - cleanup must not mask the rollout's outcome
        log.debug("abandoning the calculator's start failed: %r", exc)
    actor = workbench._actor
    try:
        if actor is not None:
            await asyncio.wait_for(workbench.stop(), WORKBENCH_STOP_TIMEOUT_S)
    except BaseException as exc:  # noqa: BLE001 - cleanup must not mask the rollout's outcome
        log.debug("stopping the calculator failed: %r", exc)
    finally:
        workbench.unwatch()
        if actor is not None:
            # AutoGen registers an atexit hook per session; once we have stopped (or given up on)
            # the session, that hook could only block the interpreter's exit.
            atexit.unregister(actor._sync_shutdown)
            actor._active = False


async def solve(config: AgentConfig, report: Callable[[str], Awaitable[T]]) -> T:
    """Run the agent on the question and return ``await report(final message)``. Raises AgentFailure.

    ``report`` (the reward's post) runs once the run has succeeded and before the calculator and
    the model client are stopped, so the reward reaches the server without waiting for that
    teardown; the teardown still happens, under the same run timeout, before the agent exits."""
    model_client = make_model_client(config)
    workbench = make_workbench(config)
    try:
        # The calculator starts while the first model call is under way: that call announces
        # the calculator's fixed tool schema, tool calls wait for the start, and a start that
        # fails ends the run (the guard) or, if no tool was called, fails it at the end.
        workbench.open_soon()
        agent = AssistantAgent(
            name="calc_agent",
            model_client=model_client,
            workbench=workbench,
            reflect_on_tool_use=True,
            # up to this many rounds of calls, each seeing the results of the last; after the
            # last round one more call, without tools, must answer (1: one round, then answer)
            max_tool_iterations=config.tool_rounds,
            system_message=SYSTEM_MESSAGES[config.prompt],
        )
        try:
            # The guard ends the run as soon as the calculator fails, even while a model call or
            # tool call is waiting (a failure raised inside AutoGen's tool task would be lost).
            result = await workbench.guard(agent.run(task=build_task(config.question)))
            await workbench.opened()
        except AgentFailure:
            raise
        except Exception as exc:
            if workbench.failure is not None:
                raise workbench.failure from exc
            if any(context_exhausted(cause) for cause in _causes(exc)):
                return await report("")  # the conversation outgrew the model's context: no answer
            failure = classify_model_error(exc, config) or _find_cause(exc, config)
            if failure is not None:
                raise failure from exc
            if isinstance(exc, RuntimeError) and _NO_TEXT_REFLECTION in str(exc):
                return await report("")
            raise
        if workbench.failure is not None:
            raise workbench.failure
        return await report(last_text(list(result.messages)))
    finally:
        await _stop_workbench(workbench)
        try:
            await model_client.close()
        except Exception as exc:  # noqa: BLE001
            log.debug("closing the model client failed: %r", exc)


def context_exhausted(exc: BaseException) -> bool:
    """Whether a model call was refused because the conversation outgrew the model's context
    (calcx.contract.gateway): the policy's own doing, so the run ends unanswered."""
    return isinstance(exc, openai.BadRequestError) and context_refused(exc.status_code, exc.body)


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception chained to it or grouped in it, each once."""
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if isinstance(current, BaseExceptionGroup):
            stack.extend(current.exceptions)
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                stack.append(linked)


def _find_cause(exc: BaseException, config: AgentConfig) -> AgentFailure | None:
    """Look through chained and grouped exceptions for a model or calculator failure."""
    for current in _causes(exc):
        if isinstance(current, AgentFailure):
            return current
        failure = classify_model_error(current, config)
        if failure is not None:
            return failure
    return None
