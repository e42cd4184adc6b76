"""A run's store -> warm-up traces: the model's own right answers reached through the calculator.

The self-distilled warm-up (docs/recipes.md) trains the base model on conversations it had itself,
not on GSM8K's terse annotations: a sample pass (`calcx train --eval-only`, several sampled
sessions a problem) records every model call at the gateway, and this keeps the rollouts that
earned a right answer with the calculator and nothing broken on the way:

- the rollout SUCCEEDED with a right answer's reward, above calcx.contract.labels.CORRECT_ABOVE (a FAILED
  one is an infrastructure failure, never a trace; a lower reward a wrong answer);
- its latest attempt made no call that was refused (an `Error` answer), left no `<tool_call>`
  block unparsed, and made at least one successful `calculate` call (calcx.trainer.rollouts.tool_use counts them);
- its last model call closed the conversation: an answer, not a call, and not cut off at the
  length limit (`finish_reason: stop`).

The trace is that last call's request, the whole conversation the agent had sent, followed by the
answer it got, with the request's `tools`: the layout `calcx data traces` writes and `calcx warmup`
reads. With `system_message` the recorded system message is replaced by that one of the agent's
messages (calcx.agent.answer.SYSTEM_MESSAGES): a sample pass may ask for the calculator in its
prompt, and the warm-up then teaches the behaviour under the message RL runs with. A problem of the
held-out files makes no trace, a conversation already kept for its problem is not kept twice, and a
problem gives at most `per_problem` traces (the first ones in the store's order).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calcx.agent.answer import SYSTEM_MESSAGES
from calcx.api.models import RecordedCall
from calcx.contract.labels import CORRECT_ABOVE, scored_reward
from calcx.data.held_out import HeldOut
from calcx.server.store.reader import StoreReader
from calcx.trainer.rollouts.tool_use import message_of, rollout_tool_use, text_of

PER_PROBLEM_DEFAULT = 4
CLOSED = "stop"
ROLES = ("system", "user", "assistant", "tool")
# why a rollout made no trace, in the order a rollout is checked
LEFT_OUT = (
    "no_row_id",  # its row has no id: nothing to hold it out by
    "held_out",  # its problem is in a held-out file
    "not_scored",  # not SUCCEEDED with a reward: an infrastructure failure
    "wrong_answer",  # a reward of a wrong answer (CORRECT_ABOVE or below)
    "no_calls",  # no answered model call recorded for its latest attempt
    "refused_call",  # a call the calculator or the agent's workbench answered with an error
    "parse_failure",  # a <tool_call> block the parser could not read
    "no_calculator",  # no successful calculate call
    "not_closed",  # the last call asked for a tool, or was cut off
    "unreadable_call",  # a request or response that is not the chat layout
    "duplicate",  # the same conversation was already kept for its problem
    "over_per_problem",  # its problem already gave per_problem traces
)


class TraceUnreadable(ValueError):
    """A recorded call that is not the chat layout a trace is made of."""


@dataclass
class StoreTraces:
    traces: list[dict[str, Any]] = field(default_factory=list)
    left_out: Counter[str] = field(default_factory=Counter)
    rollouts: int = 0  # rollouts read
    calls: int = 0  # successful calculator calls in the kept traces

    @property
    def problems(self) -> int:
        return len({trace["id"] for trace in self.traces})


def _tool_call(call: Any) -> dict[str, Any]:
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        raise TraceUnreadable("a tool call without its function")
    function = call["function"]
    arguments = function.get("arguments")
    if not isinstance(arguments, str):  # the chat layout's arguments are a JSON string
        arguments = json.dumps(arguments)
    return {
        "id": str(call.get("id")),
        "type": "function",
        "function": {"name": str(function.get("name")), "arguments": arguments},
    }


def trace_message(message: Any) -> dict[str, Any]:
    """A request's or response's chat message as a trace holds it: role, content as text (None
    for an assistant's call with no text), the calls of an assistant, the call id of a tool answer;
    every other field (reasoning, refusals, names) dropped."""
    if not isinstance(message, Mapping) or message.get("role") not in ROLES:
        raise TraceUnreadable(f"a message whose role is not one of {', '.join(ROLES)}")
    role = str(message["role"])
    content = text_of(message.get("content"))
    if role == "tool":
        return {"role": role, "tool_call_id": str(message.get("tool_call_id")), "content": content}
    calls = message.get("tool_calls") if role == "assistant" else None
    if calls:
        if not isinstance(calls, list):
            raise TraceUnreadable("tool_calls is not a list")
        return {"role": role, "content": content or None, "tool_calls": [_tool_call(c) for c in calls]}
    return {"role": role, "content": content}


def _finish_reason(response: Mapping[str, Any] | None) -> object:
    try:
        return response["choices"][0].get("finish_reason")  # type: ignore[index]
    except (TypeError, KeyError, IndexError, AttributeError):
        return None


def conversation(calls: Sequence[RecordedCall], system_message: str | None = None) -> list[dict[str, Any]] | None:
    """The messages of the attempt's last call and its answer (None when that answer asked for a
    tool or was cut off), the system message replaced by `system_message`'s text when named."""
    last = calls[-1]
    answer = message_of(last.response)
    if answer.get("tool_calls") or _finish_reason(last.response) != CLOSED or not text_of(answer.get("content")):
        return None
    sent = last.request.get("messages")
    if not isinstance(sent, list) or not sent:
        raise TraceUnreadable("the last call's request has no messages")
    messages = [trace_message(m) for m in sent] + [trace_message({**answer, "role": "assistant"})]
    if system_message is not None:
        if messages[0]["role"] != "system":
            raise TraceUnreadable("the conversation does not open with a system message")
        messages[0] = {"role": "system", "content": SYSTEM_MESSAGES[system_message]}
    return messages


def _tools(calls: Sequence[RecordedCall]) -> list[dict[str, Any]]:
    tools = calls[-1].request.get("tools")
    if not isinstance(tools, list) or not tools:
        raise TraceUnreadable("the last call's request offers no tools")
    return tools


def _rollout_trace(
    store: StoreReader, rollout_id: str, attempt_no: int, row: Mapping[str, Any], system_message: str | None
) -> tuple[dict[str, Any] | None, str | None, int]:
    """(trace, None, calculator calls) of a rollout scored right, or (None, why it made none, 0)."""
    calls = store.attempt_calls(rollout_id, attempt_no)
    if not calls:
        return None, "no_calls", 0
    chain = row.get("chain")
    use = rollout_tool_use(calls, str(chain) if chain is not None else None)
    if use.calls > use.successful:
        return None, "refused_call", 0
    if use.parse_failures:
        return None, "parse_failure", 0
    if not use.used_calculator:
        return None, "no_calculator", 0
    try:
        messages = conversation(calls, system_message)
        if messages is None:
            return None, "not_closed", 0
        tools = _tools(calls)
    except TraceUnreadable:
        return None, "unreadable_call", 0
    trace = {
        "id": str(row["id"]),
        "source": str(row.get("source") or "gsm8k"),
        "messages": messages,
        "tools": tools,
        "rollout_id": rollout_id,
    }
    return trace, None, use.successful


def store_traces(
    stores: Iterable[str | Path],
    held_out: HeldOut,
    *,
    per_problem: int = PER_PROBLEM_DEFAULT,
    system_message: str | None = None,
) -> StoreTraces:
    """The traces of every store's rollouts (module docstring), and why the others made none."""
    if per_problem < 1:
        raise ValueError(f"per_problem must be at least 1, got {per_problem}")
    if system_message is not None and system_message not in SYSTEM_MESSAGES:
        raise ValueError(f"system_message must be one of {', '.join(SYSTEM_MESSAGES)}, got {system_message!r}")
    result = StoreTraces()
    kept: dict[str, set[str]] = {}
    for path in stores:
        with StoreReader(path) as store:
            for rollout_id, spec, state, reward, attempt_no in store.rollout_records():
                result.rollouts += 1
                row: dict[str, Any] = spec["row"] if isinstance(spec.get("row"), dict) else {}
                scored = scored_reward(state, reward)
                why: str | None = None
                if row.get("id") is None:
                    why = "no_row_id"
                elif held_out.holds(row):
                    why = "held_out"
                elif scored is None:
                    why = "not_scored"
                elif scored <= CORRECT_ABOVE:
                    why = "wrong_answer"
                if why is not None:
                    result.left_out[why] += 1
                    continue
                trace, why, calculator_calls = _rollout_trace(store, rollout_id, attempt_no, row, system_message)
                if trace is None:
                    result.left_out[str(why)] += 1
                    continue
                seen = kept.setdefault(trace["id"], set())
                key = json.dumps(trace["messages"], sort_keys=True)
                if key in seen:
                    result.left_out["duplicate"] += 1
                elif len(seen) >= per_problem:
                    result.left_out["over_per_problem"] += 1
                else:
                    seen.add(key)
                    result.traces.append(trace)
                    result.calls += calculator_calls
    return result


def left_out_line(left_out: Mapping[str, int]) -> str:
    """`reason count, ...` in LEFT_OUT's order (what a rollout is checked for first comes first)."""
    return ", ".join(f"{reason} {left_out[reason]}" for reason in LEFT_OUT if left_out.get(reason))
