"""The anchor's reward function gives what calcx's agent gets for the same final message.

The agent scores its last message with `reward(extract_answer(message), result)`. verl hands the
anchor's function the whole decoded ToolAgentLoop response, which after a calculator round starts
with the first turn and the calculator's answers (special tokens skipped, role names left).
"""

from __future__ import annotations

import json

import pytest

from calcx.agent.answer import extract_answer
from calcx.agent.reward import reward
from calcx.anchor.reward import compute_score, final_message

# (the agent's final message, the row's result, the reward it earns)
CASES = [
    ("### ANSWER: 89 ###", "89", 1.0),
    ("So the total is ### ANSWER: 89.0 ###", "89", 1.0),
    ("### ANSWER: 1,000 ###", "1000", 1.0),
    ("### ANSWER: (c) ###", "C", 1.0),
    ("### ANSWER: 0.6667 ###", "2/3 = around 0.666667", 1.0),
    ("89", "89", 1.0),  # no answer marker: the whole message is the answer
    ("### ANSWER: 90 ###", "89", 0.0),
    ("### ANSWER: B ###", "C", 0.0),
    ("### ANSWER: 9**9**9 ###", "89", 0.0),  # never evaluated
    ("I cannot tell.", "89", 0.0),
    ("", "89", 0.0),
    ('<tool_call>\n{"name": "calculate", "arguments": {"expression": "1+1"}}\n</tool_call>', "2", 0.0),
]


def first_turn(text: str, expression: str, answer: str) -> str:
    """A decoded first turn with one calculator round, up to the last turn (hermes/ChatML template,
    `skip_special_tokens=True`, as verl's reward manager decodes)."""
    call = json.dumps({"name": "calculate", "arguments": {"expression": expression}})
    return f"{text}\n<tool_call>\n{call}\n</tool_call>\nuser\n<tool_response>\n{answer}\n</tool_response>\nassistant\n"


@pytest.mark.parametrize("message,result,expected", CASES)
def test_single_turn_reward_is_the_agents(message: str, result: str, expected: float) -> None:
    assert reward(extract_answer(message), result) == expected  # the table is calcx's own verdict
    assert compute_score("gsm8k", message, result, {"num_turns": 2}) == expected
    assert compute_score("gsm8k", message, result) == expected


@pytest.mark.parametrize("message,result,expected", CASES)
def test_after_a_calculator_round_the_last_turn_is_scored(message: str, result: str, expected: float) -> None:
    # the first turn's own (wrong) answer and the calculator's text must not count
    response = first_turn("Maybe ### ANSWER: 7 ### ; checking", "41 + 48", "89") + message
    assert compute_score("gsm8k", response, result, {"num_turns": 4}) == expected
    assert compute_score("gsm8k", response, result, {"num_turns": 3}) == expected
    assert compute_score("gsm8k", response, result) == expected


def test_final_message_keeps_single_turns_whole() -> None:
    text = "Quoting: </tool_response> ### ANSWER: 5 ###"
    assert final_message(text, 2) == text  # a single turn is the agent's message as it is
    response = first_turn("", "1/0", "Error executing tool calculate: division by zero") + "### ANSWER: 3 ###"
    assert final_message(response, 4) == "### ANSWER: 3 ###"
    assert compute_score("x", response, "3", {"num_turns": 4}) == 1.0


def test_a_rows_own_tolerance_reaches_the_anchors_score() -> None:
    """A row that asks for the exact answer (the hard split's `rel_tol`, carried in extra_info by
    verl_record) is scored as the agent scores it: 0.5% off fails, the exact answer passes."""
    from calcx.data.hard import HARD_REL_TOL
    from calcx.trainer.run.data import verl_record

    row = {"id": "h1", "question": "q", "chain": "", "result": "63648", "source": "gsm8k-hard", "rel_tol": HARD_REL_TOL}
    extra = verl_record(row, 0, prompt=[], agent_name="a")["extra_info"]
    assert extra == {"index": 0, "id": "h1", "rel_tol": HARD_REL_TOL}
    assert compute_score("gsm8k-hard", "### ANSWER: 63968 ###", "63648", {**extra, "num_turns": 2}) == 0.0
    assert compute_score("gsm8k-hard", "### ANSWER: 63648 ###", "63648", {**extra, "num_turns": 2}) == 1.0
    # a GSM8K row sets none: Calc-X's 1e-2. One parquet of both kinds reads back null for it
    del row["rel_tol"]
    assert "rel_tol" not in verl_record(row, 0, prompt=[], agent_name="a")["extra_info"]
    for extra in ({"index": 0, "num_turns": 2}, {"index": 0, "rel_tol": None, "num_turns": 2}):
        assert compute_score("gsm8k", "### ANSWER: 63968 ###", "63648", extra) == 1.0
