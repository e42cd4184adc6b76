"""An agent's earlier model turns, sent back to the model as the model wrote them.

vLLM's `hermes` tool-call parser (the one calcx's trainer configures, and tells the server with
`--tool-call-parser`) splits a model turn at its
first `<tool_call>`: the text before it becomes the message's `content`, keeping the line break the
model wrote before the tag, and the calls go apart as `tool_calls`. The agent sends that message back
in its next call, and Hermes/ChatML chat templates (Qwen2.5's own, calcx's `hermes`) render it as
content, a line break, then the calls: the turn now carries two line breaks where the model wrote
one, tokenizes differently from what it generated, and no later call's prompt continues the earlier
call's tokens. Dropping that one line break renders the turn as generated, so the model reads back
what it wrote and the trainer can keep a rollout's calls as one sequence (calcx.trainer.call_join).
Measured on an H200 run's calls: benchmarks/RESULTS.md, "One sequence a rollout".
"""

from __future__ import annotations

from typing import Any

#: the tool-call parser whose split this undoes (ServerSettings.tool_call_parser)
HERMES = "hermes"


def for_the_model(messages: list[Any], tool_call_parser: str) -> list[Any]:
    """The messages as the model servers should render them: with `hermes`, `as_generated`;
    with another or an unknown parser, as the agent sent them."""
    return as_generated(messages) if tool_call_parser == HERMES else messages


def as_generated(messages: list[Any]) -> list[Any]:
    """`messages` with one trailing line break dropped from the text of each assistant message that
    also carries tool calls (the rest, and anything that is not such a message, unchanged)."""
    out: list[Any] = []
    for message in messages:
        if (isinstance(message, dict) and message.get("role") == "assistant" and message.get("tool_calls")
                and isinstance(message.get("content"), str) and message["content"].endswith("\n")):
            message = {**message, "content": message["content"][:-1]}
        out.append(message)
    return out
