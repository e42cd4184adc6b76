"""An agent's model turns under vLLM's `hermes` tool-call parser: earlier turns sent back to the
model as the model wrote them, and calls written in the chat template's own example read as calls.

vLLM's `hermes` tool-call parser (the one calcx's trainer configures, and tells the server with
`--tool-call-parser`) splits a model turn at its
first `<tool_call>`: the text before it becomes the message's `content`, keeping the line break the
model wrote before the tag, and the calls go apart as `tool_calls`. The agent sends that message back
in its next call, and Hermes/ChatML chat templates (Qwen2.5's own, calcx's `hermes`) render it as
content, a line break, then the calls: the turn now carries two line breaks where the model wrote
one, tokenizes differently from what it generated, and no later call's prompt continues the earlier
call's tokens. Dropping that one line break renders the turn as generated, so the model reads back
what it wrote and the trainer can keep a rollout's calls as one sequence (calcx.trainer.rollouts.call_join).
Measured on an H200 run's calls: benchmarks/RESULTS.md, "One sequence a rollout".

Qwen2.5's chat template, as its GGUF carries it, shows the call format as
`<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>`: the braces
doubled inside a string, so the rendered prompt shows them doubled. A small model copies the
example: most of its first calls (26 of 36 at the first step of an H200 run) came back as
`{{"name": "calculate", "arguments": {...}}}`, which vLLM's parser cannot read, so the call was
never made, the rollout ended without an answer, and GRPO taught the model to stop calling.
`read_template_calls` reads such a turn as the calls it states: every `<tool_call>` block must be
JSON once one doubled brace at its start (and the unmatched one at its end) is undone, else the
turn stays as vLLM returned it (a parse failure, the model's own mistake).
"""

from __future__ import annotations

import json
import re
import uuid
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
        if (
            isinstance(message, dict)
            and message.get("role") == "assistant"
            and message.get("tool_calls")
            and isinstance(message.get("content"), str)
            and message["content"].endswith("\n")
        ):
            message = {**message, "content": message["content"][:-1]}
        out.append(message)
    return out


_CALL_BLOCK_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
TOOL_CALL_START = "<tool_call>"


def _template_call(block: str) -> dict[str, Any] | None:
    """The call one `<tool_call>` block states in the template's doubled-brace form, else None."""
    text = block.strip()
    if not text.startswith("{{"):
        return None
    try:
        call, end = json.JSONDecoder().raw_decode(text[1:])
    except ValueError:
        return None
    if text[1:][end:].strip() not in ("", "}"):
        return None
    name, arguments = (call.get("name"), call.get("arguments")) if isinstance(call, dict) else (None, None)
    if not isinstance(name, str) or not isinstance(arguments, dict):
        return None
    return {
        "id": f"chatcmpl-tool-{uuid.uuid4().hex}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def read_template_calls(payload: dict[str, Any]) -> dict[str, Any] | None:
    """The chat-completion answer with the calls of its first choice read from its text, when vLLM's
    hermes parser left them there because they are written in the template's doubled-brace form
    and every block reads as a call that way; None when there is nothing to read (the answer stands
    as it came). The text before the first call stays the message's content, as the parser keeps it."""
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    if not isinstance(message, dict) or message.get("tool_calls"):
        return None
    content = message.get("content")
    if not isinstance(content, str) or TOOL_CALL_START not in content:
        return None
    blocks = _CALL_BLOCK_RE.findall(content)
    calls = [_template_call(block) for block in blocks]
    if not calls or any(call is None for call in calls):
        return None
    before = content[: content.index(TOOL_CALL_START)]
    finish = choices[0].get("finish_reason")
    choice = {
        **choices[0],
        "message": {**message, "content": before if before.strip() else None, "tool_calls": calls},
        "finish_reason": "tool_calls" if finish == "stop" else finish,
    }
    return {**payload, "choices": [choice, *choices[1:]]}
