"""calcx's reward as verl's custom reward function, for the anchor's ToolAgentLoop rollouts.

The agent scores its final message: `reward(extract_answer(message), result)`
(calcx.agent.main). verl hands a reward function the whole decoded response instead: with a
calculator round that is the first turn, the tool call, the tool's answer inside the chat
template's `<tool_response>` block, then the turn after it, each opened by its role name (the
special tokens around it are skipped in decoding). So a response with more than one turn is scored
on the text after its last `</tool_response>` (less the `assistant` role line): the answer the
agent would have scored.

verl loads it as `reward.custom_reward_function.path=pkg://calcx.anchor.reward`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from calcx.agent.answer import extract_answer
from calcx.agent.reward import reward
from calcx.contract.env import CALC_X_REL_TOL, REL_TOL_FIELD, parse_rel_tol

# how the Hermes/ChatML templates (the Qwen models' own, calcx's `hermes`) close a tool's answer
TOOL_RESPONSE_END = "</tool_response>"
ASSISTANT_ROLE = "assistant"
# verl's `num_turns` of a response with no tool round: the prompt and one assistant turn
SINGLE_TURN = 2


def final_message(solution_str: str, num_turns: int | None = None) -> str:
    """The last assistant turn of a decoded ToolAgentLoop response."""
    if num_turns is not None and num_turns <= SINGLE_TURN:
        return solution_str
    _, closed, after = solution_str.rpartition(TOOL_RESPONSE_END)
    if not closed:
        return solution_str
    after = after.lstrip()
    return after[len(ASSISTANT_ROLE) :].removeprefix("\n") if after.startswith(ASSISTANT_ROLE) else after


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: Mapping[str, Any] | None = None, **_: Any
) -> float:
    """verl's custom reward hook: 1.0 when the final answer matches the row's result (within the
    row's own tolerance, when it sets one), else 0.0."""
    extra = extra_info or {}
    turns = extra.get("num_turns")
    message = final_message(solution_str, int(turns) if turns is not None else None)
    tolerance = extra.get(REL_TOL_FIELD)
    rel_tol = CALC_X_REL_TOL if tolerance is None else parse_rel_tol(tolerance, what=REL_TOL_FIELD)
    return float(reward(extract_answer(message), str(ground_truth), rel_tol))
