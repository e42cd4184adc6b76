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
never made, the rollout ended without an answer, and GRPO taught the model to stop calling. Later
in training the same model writes several calls a turn and, beside them, blocks it fills with a
made-up result (`<tool_call>\n19100\n</tool_call>`) or a call cut off at the end; vLLM's parser
then drops every call of the turn (114 of the 226 turns an H200 run left unread read so).
`read_stated_calls` reads such a turn as the calls it states: each `<tool_call>` block that opens
with a brace must be a call, as JSON or once the doubled brace at its start (and the unmatched one
at its end) is undone; a block that does not open with one is no call (a made-up result) and is
left out, as is a last block cut off before its closing tag; at least one call must read. A block
that opens with a brace and is no call (broken JSON, other keys) keeps the turn as vLLM returned
it: a parse failure, the model's own mistake.
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


_CALL_BLOCK_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"


class _NotACall(ValueError):
    """A block that opens as a call and is none: the turn stays a parse failure."""


def _stated_call(block: str, closed: bool) -> dict[str, Any] | None:
    """The call one `<tool_call>` block states (plain JSON, or the template's doubled-brace form);
    None for a block that is no call attempt (it does not open with a brace, or it is the last one
    and was cut off before its closing tag); _NotACall for one that opens as a call and is none."""
    text = block.strip()
    if not text.startswith("{"):
        return None
    doubled = text.startswith("{{")
    try:
        call, end = json.JSONDecoder().raw_decode(text[1:] if doubled else text)
    except ValueError:
        if not closed:
            return None
        raise _NotACall(text[:80]) from None
    rest = (text[1:] if doubled else text)[end:].strip()
    name, arguments = (call.get("name"), call.get("arguments")) if isinstance(call, dict) else (None, None)
    if rest not in (("", "}") if doubled else ("",)) or not isinstance(name, str) or not isinstance(arguments, dict):
        raise _NotACall(text[:80])
    return {
        "id": f"chatcmpl-tool-{uuid.uuid4().hex}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def read_stated_calls(payload: dict[str, Any]) -> dict[str, Any] | None:
    """The chat-completion answer with the calls of its first choice read from its text, when vLLM's
    hermes parser left them there (the template's doubled-brace form, or well-formed calls beside a
    block that is none) and each block that opens as a call is one; None when there is nothing to
    read (the answer stands as it came). The text before the first call stays the message's
    content, as the parser keeps it."""
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    if not isinstance(message, dict) or message.get("tool_calls"):
        return None
    content = message.get("content")
    if not isinstance(content, str) or TOOL_CALL_START not in content:
        return None
    calls = []
    for found in _CALL_BLOCK_RE.finditer(content):
        try:
            call = _stated_call(found.group(1), closed=found.group(0).endswith(TOOL_CALL_END))
        except _NotACall:
            return None
        if call is not None:
            calls.append(call)
    if not calls:
        return None
    before = content[: content.index(TOOL_CALL_START)]
    finish = choices[0].get("finish_reason")
    choice = {
        **choices[0],
        "message": {**message, "content": before if before.strip() else None, "tool_calls": calls},
        "finish_reason": "tool_calls" if finish == "stop" else finish,
    }
    return {**payload, "choices": [choice, *choices[1:]]}
