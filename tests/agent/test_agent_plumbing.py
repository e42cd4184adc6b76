"""Reward posting against a real HTTP receiver, and how errors are classified."""

from __future__ import annotations

import asyncio

import anyio
import httpx2
import openai
import pytest
from agent_harness import closed_port
from mcp.shared.exceptions import McpError
from mcp.types import CONNECTION_CLOSED, ErrorData

from calcx.agent.config import AgentConfig
from calcx.agent.failures import RewardPostFailed
from calcx.agent.reward_post import post_reward, reward_event
from calcx.agent.rollout import classify_model_error
from calcx.agent.workbench import transport_failure

CONFIG = AgentConfig(question="q", result="1", base_url="http://127.0.0.1:9/v1", event_url="http://e", key="k")


def test_reward_posted_with_bearer_key(event_server, event_log):
    answer = asyncio.run(post_reward(f"{event_server.url}/ok/unit", "key-unit", 0.5))
    assert answer["event_id"]
    assert event_log.for_path("/ok/unit") == [("Bearer key-unit", {"event_type": "reward", "data": {"value": 0.5}})]


def test_reward_post_retries_5xx_then_fails(event_server, event_log):
    with pytest.raises(RewardPostFailed, match="after 3 attempts.*HTTP 500"):
        asyncio.run(post_reward(f"{event_server.url}/broken/unit", "k", 1.0, attempts=3))
    assert len(event_log.for_path("/broken/unit")) == 3


def test_reward_post_connection_refused_fails():
    with pytest.raises(RewardPostFailed, match="ConnectError"):
        asyncio.run(post_reward(f"http://127.0.0.1:{closed_port()}/events", "k", 1.0, attempts=2))


def test_reward_event_rejects_non_finite():
    with pytest.raises(ValueError):
        reward_event(float("nan"))


def _status_error(status: int) -> openai.APIStatusError:
    # openai 3 speaks httpx2 (its fork of httpx): its errors carry httpx2 requests and responses
    request = httpx2.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
    response = httpx2.Response(status, request=request, json={"error": {"message": "nope"}})
    return openai.APIStatusError("nope", response=response, body=None)


@pytest.mark.parametrize(
    "status, reason",
    [
        (500, "model_unreachable"),
        (503, "model_unreachable"),
        (404, "model_unreachable"),
        (401, "bad_environment"),
        (403, "bad_environment"),
    ],
)
def test_model_status_errors_are_infrastructure(status, reason):
    failure = classify_model_error(_status_error(status), CONFIG)
    assert failure is not None and failure.reason == reason


def test_connection_error_is_model_unreachable():
    error = openai.APIConnectionError(request=httpx2.Request("POST", "http://127.0.0.1:9/v1"))
    failure = classify_model_error(error, CONFIG)
    assert failure is not None and failure.reason == "model_unreachable"


def test_other_errors_are_not_model_failures():
    assert classify_model_error(ValueError("bad tool arguments"), CONFIG) is None


@pytest.mark.parametrize(
    "exc",
    [
        McpError(ErrorData(code=408, message="Timed out")),
        McpError(ErrorData(code=CONNECTION_CLOSED, message="Connection closed")),
        anyio.ClosedResourceError(),
        anyio.BrokenResourceError(),
        RuntimeError("MCP Actor not running, call initialize() first"),
        ExceptionGroup("tg", [anyio.BrokenResourceError()]),
    ],
)
def test_calculator_transport_failures(exc):
    assert transport_failure(exc) is not None


@pytest.mark.parametrize(
    "exc",
    [
        McpError(ErrorData(code=-32602, message="Invalid params")),
        ValueError("Unknown tool: web_search"),
        KeyError("expression"),
    ],
)
def test_tool_call_mistakes_are_not_transport_failures(exc):
    assert transport_failure(exc) is None
