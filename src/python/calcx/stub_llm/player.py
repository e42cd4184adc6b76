"""The scripted model: given a chat request and a mode, the assistant turn it plays.

Turn rules: after a tool result, answer with that result; with tools offered and
no tool result yet, call the calculator-like tool; otherwise answer directly. In
``steps`` mode the calls go one a round, each on the result of the last, so an
agent's number of tool rounds shows in its answer.
Everything is a pure function of the request, so the same request always gets
the same response (ids and tokens included).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from calcx.agent.numeric import try_evaluate
from calcx.stub_llm.modes import Mode
from calcx.stub_llm.script import Script, strip_markers
from calcx.stub_llm.tokens import content_text

UNKNOWN_TOOL_NAME = "web_search"
STEPS_DEFAULT = 3
_OPTION_RE = re.compile(r"\b([A-E])\)\s*([-+\d.,/_ ]+?)(?=\s+[A-E]\)|\s*$)")


@dataclass
class Turn:
    """One assistant message: text, or tool calls (with the text they render to)."""

    content: str | None
    tool_calls: list[dict] = field(default_factory=list)
    kind: str = "answer"  # "tool_call" | "answer"

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool_calls else "stop"


def format_number(value: float) -> str:
    if math.isfinite(value) and value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.6g}" if abs(value) >= 1e15 or abs(value) < 1e-4 else repr(round(value, 6))


def wrong_number(value: float) -> float:
    """A number that never matches ``value`` within 1 %."""
    return abs(value) * 2 + 7


def first_text(messages: list[dict], role: str = "user") -> str:
    """The text of the conversation's first message of `role` ('' when there is none)."""
    for message in messages:
        if message.get("role") == role:
            return content_text(message.get("content"))
    return ""


def conversation_text(messages: list[dict]) -> str:
    return "\n".join(content_text(m.get("content")) for m in messages if m.get("role") in ("user", "system"))


def pick_tool(tools: list[dict]) -> str | None:
    names = [
        name for t in tools if isinstance(t, dict) and isinstance(name := (t.get("function") or {}).get("name"), str)
    ]
    for name in names:
        if "calc" in name.lower():
            return name
    return names[0] if names else None


def call_id(seed: str) -> str:
    return "call_" + hashlib.sha256(seed.encode("utf-8")).hexdigest()[:16]


def option_letter(question: str, value: float) -> str | None:
    """The multiple-choice letter whose option equals ``value`` ("Answer Choices: A) 12 B) 15 ...")."""
    for letter, option in _OPTION_RE.findall(question[-2000:]):
        number = try_evaluate(option.strip())
        if number is not None and math.isclose(number, value, rel_tol=1e-6, abs_tol=1e-9):
            return letter
    return None


def _answer_text(value: float | None, mode: Mode, question: str) -> str:
    if value is None:
        return "I could not work out the answer. ### ANSWER: unknown ###"
    if mode.name == "wrong":
        value = wrong_number(value)
    number = option_letter(question, value) or format_number(value)
    if mode.name == "noformat":
        return f"The result is {number}, I think."
    return f"The calculation gives {number}. ### ANSWER: {number} ###"


def _tool_call(tool_name: str, expression: str, seed: str) -> Turn:
    call = {
        "id": call_id(seed),
        "type": "function",
        "function": {"name": tool_name, "arguments": json.dumps({"expression": expression})},
    }
    return Turn(content=None, tool_calls=[call], kind="tool_call")


def _next_step(request: dict[str, Any], mode: Mode, script: Script) -> Turn | None:
    """``steps`` mode: the next call of the chain (the question's expression, then the last
    result + 1), or None once the chain is done or tools are not offered (the usual rules answer)."""
    messages: list[dict] = request["messages"]
    tool_name = pick_tool(request.get("tools") or []) if request.get("tool_choice") != "none" else None
    results = [m for m in messages if m.get("role") == "tool"]
    wanted = int(mode.seconds) if mode.seconds is not None else STEPS_DEFAULT
    if tool_name is None or len(results) >= wanted:
        return None
    question = first_text(messages)
    if results:
        last = try_evaluate(content_text(results[-1].get("content")).strip())
        expression = f"{format_number(last)} + 1" if last is not None else None
    else:
        expression = script.expression_for(question)
    if expression is None:
        return None
    return _tool_call(tool_name, expression, json.dumps([strip_markers(question), len(messages), mode.name]))


def play(request: dict[str, Any], mode: Mode, script: Script) -> Turn:
    """The assistant turn for ``request`` in ``mode`` (slow/hang/error500 are handled by the app)."""
    messages: list[dict] = request["messages"]
    tools = request.get("tools") or []
    question = first_text(messages)
    if mode.name == "steps" and (step := _next_step(request, mode, script)) is not None:
        return step
    last = messages[-1]
    if last.get("role") == "tool":
        value = try_evaluate(content_text(last.get("content")).strip())
        return Turn(content=_answer_text(value, mode, question))
    expression = script.expression_for(question)
    tool_name = pick_tool(tools) if request.get("tool_choice") != "none" else None
    already_called = any(m.get("role") == "assistant" and m.get("tool_calls") for m in messages)
    if tool_name is None or already_called or mode.name == "direct":
        value = try_evaluate(expression) if expression else None
        return Turn(content=_answer_text(value, mode, question))
    if expression is None:
        return Turn(content="I cannot find the arithmetic in this question. ### ANSWER: unknown ###")
    seed = json.dumps([strip_markers(question), len(messages), mode.name])
    if mode.name == "unknowntool":
        name, arguments = UNKNOWN_TOOL_NAME, json.dumps({"query": strip_markers(question)[:80]})
    elif mode.name == "badjson":
        name, arguments = tool_name, '{"expression": "' + expression.replace('"', "")
    else:
        name, arguments = tool_name, json.dumps({"expression": expression})
    tool_call = {"id": call_id(seed), "type": "function", "function": {"name": name, "arguments": arguments}}
    return Turn(content=None, tool_calls=[tool_call], kind="tool_call")
