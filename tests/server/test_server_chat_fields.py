"""A hostile agent cannot choose what comes back as the policy's sample: the gateway forwards only
the fields of `calcx.server.chat_fields.CHAT_FIELDS`. Fields that change what is sampled (a logit
bias, a minimum length, ignoring EOS, a priority, a grammar, a forced tool call) and fields it does
not know are a 400 `field_not_allowed` naming the field, never forwarded or recorded; for a rollout
created with sampling, the agent's sampling parameters are replaced by the rollout's, and those the
rollout leaves out are dropped."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from calcx.api.client import CalcxClient
from calcx.server.chat_fields import CHAT_FIELDS, Rule
from calcx.server.serve import ServerThread

ROW = {"question": "What is 2 + 2 ?", "result": "4"}
MESSAGES = [{"role": "user", "content": "What is 2 + 2 ?"}]
TRAINER = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "arithmetic",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]

#: What a hostile agent sends to make tokens of its choosing come back as the policy's sample.
HOSTILE: list[tuple[str, Any, str]] = [
    ("logit_bias", {"1001": 100}, "changes what the policy samples"),
    ("min_tokens", 4000, "changes what the policy samples"),
    ("ignore_eos", True, "changes what the policy samples"),
    ("priority", -100, "how its requests are scheduled"),
    ("guided_json", {"type": "object"}, "changes what the policy samples"),
    ("allowed_token_ids", [1001], "changes what the policy samples"),
    ("top_logprobs", 20, "changes what the policy samples"),
    ("chat_template", "{{ 'x' }}", "changes what the policy samples"),
    ("tool_choice", "required", "grammar"),
    ("tool_choice", {"type": "function", "function": {"name": "calculate"}}, "grammar"),
    ("response_format", {"type": "json_object"}, "grammar"),
    ("frobnicate", 1, "not a field the calcx gateway forwards"),
]


@pytest.fixture
def attempt(client: CalcxClient, upstream: Any) -> tuple[str, str]:
    client.put_models("policy", [upstream.url])
    client.create_rollouts([{"rollout_id": "trained", "row": ROW, "sampling": TRAINER}])
    claim = client.claim("ctl", 1, timeout_s=2).claims[0]
    return claim.attempt_id, claim.token


def post(server: ServerThread, aid: str, token: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/rollouts/trained/attempts/{aid}/v1/chat/completions",
        headers={"Authorization": f"Bearer {token}"},
        json=body,
        timeout=30,
    )


@pytest.mark.parametrize(("field", "value", "says"), HOSTILE, ids=[f"{f}={v!r}"[:40] for f, v, _ in HOSTILE])
def test_a_field_that_changes_what_is_sampled_is_refused_and_nothing_is_forwarded(
    server: ServerThread,
    client: CalcxClient,
    upstream: Any,
    attempt: tuple[str, str],
    field: str,
    value: Any,
    says: str,
) -> None:
    aid, token = attempt
    refused = post(server, aid, token, {"model": "x", "messages": MESSAGES, "tools": TOOLS, field: value})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "field_not_allowed", error
    assert (repr(field) in error["message"] or f"{field}=" in error["message"]) and says in error["message"], error
    assert upstream.requests == [] and client.calls("trained") == []


def test_the_rollouts_sampling_replaces_every_sampling_parameter_of_the_agent(
    server: ServerThread, client: CalcxClient, upstream: Any, attempt: tuple[str, str]
) -> None:
    aid, token = attempt
    agent = {
        "temperature": 0.01,
        "top_k": 1,
        "top_p": 0.01,
        "seed": 5,
        "min_p": 0.9,
        "presence_penalty": 2.0,
        "frequency_penalty": -2.0,
        "repetition_penalty": 3.0,
    }
    allowed = {
        "tools": TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "stop": ["</answer>"],
        "user": "agent-7",
        "response_format": {"type": "text"},
    }
    answer = post(
        server,
        aid,
        token,
        {
            "model": "x",
            "messages": MESSAGES,
            "max_tokens": 50,
            "logprobs": False,
            "stream_options": {"include_usage": True},
            **agent,
            **allowed,
        },
    )
    assert answer.status_code == 200, answer.text
    (sent,) = upstream.requests
    # exactly the rollout's sampling, none of the agent's
    assert {k: sent[k] for k in sent if CHAT_FIELDS[k].rule is Rule.SAMPLING} == TRAINER
    assert {k: sent[k] for k in allowed} == allowed  # the conversation's own fields, as sent
    assert (sent["model"], sent["logprobs"], sent["return_token_ids"], sent["stream"], sent["max_tokens"]) == (
        "policy",
        True,
        True,
        False,
        50,
    )
    assert "stream_options" not in sent and set(sent) <= set(CHAT_FIELDS)
    assert client.calls("trained")[0].request == sent  # the recorded request is the one forwarded
