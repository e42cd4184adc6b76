"""Calls vLLM's hermes parser left in a turn's text are read as the calls they state: the chat
template's own doubled-brace example form, and well-formed calls beside a block that is no call (a
made-up result, a last block cut off); a block that opens as a call and is none keeps the turn as it
came."""

from __future__ import annotations

import json
from typing import Any

from calcx.server.assistant_turns import read_stated_calls


def _answer(content: Any, finish: str = "stop", **message: Any) -> dict[str, Any]:
    return {
        "id": "a",
        "prompt_token_ids": [1],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, **message},
                "finish_reason": finish,
                "token_ids": [5, 6],
            }
        ],
    }


def _calls(payload: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in payload["choices"][0]["message"]["tool_calls"]
    ]


def test_the_doubled_brace_forms_seen_on_a_gpu_run_are_read() -> None:
    # as a 1.5B model wrote them at the first step of an H200 run: the closing braces doubled or not
    seen = [
        '<tools></tools>\n<tool_call>\n{{"name": "calculate", "arguments": {"expression": "2 * 6 / 4"}}}\n</tool_call>',
        '<tool_call>\n{{"name": "calculate", "arguments": {"expression": "72 - (12 * 3) + (7 * 3)"}}\n</tool_call>\n'
        "### ANSWER: 36",
    ]
    first = read_stated_calls(_answer(seen[0]))
    assert first is not None and _calls(first) == [("calculate", {"expression": "2 * 6 / 4"})]
    message = first["choices"][0]["message"]
    assert message["content"] == "<tools></tools>\n" and first["choices"][0]["finish_reason"] == "tool_calls"
    assert message["tool_calls"][0]["type"] == "function" and message["tool_calls"][0]["id"].startswith(
        "chatcmpl-tool-"
    )
    second = read_stated_calls(_answer(seen[1]))
    assert second is not None and _calls(second) == [("calculate", {"expression": "72 - (12 * 3) + (7 * 3)"})]
    assert second["choices"][0]["message"]["content"] is None  # nothing before the call; the text after it goes
    assert second["choices"][0]["token_ids"] == [5, 6] and second["prompt_token_ids"] == [1]  # the model's tokens
    two = read_stated_calls(
        _answer(
            '<tool_call>\n{{"name": "calculate", "arguments": {"expression": "2*14"}}\n'
            '</tool_call>\n<tool_call>\n{{"name": "calculate", "arguments": '
            '{"expression": "14+6"}}\n</tool_call>'
        )
    )
    assert two is not None and _calls(two) == [
        ("calculate", {"expression": "2*14"}),
        ("calculate", {"expression": "14+6"}),
    ]


def test_calls_beside_blocks_that_are_none_are_read_as_seen_on_a_gpu_run() -> None:
    """As the model wrote them late in an H200 run: a call, then a block with the result it made up;
    plain and doubled-brace calls in one turn; a last call cut off before its closing tag."""
    made_up = read_stated_calls(
        _answer(
            'Step 1.\n<tool_call>\n{{"name": "calculate", "arguments": {"expression": "150 * 134"}}\n</tool_call>\n\n'
            "After the calculation, the total cost is:\n\n<tool_call>\n19100\n</tool_call>\n### Step 2"
        )
    )
    assert made_up is not None and _calls(made_up) == [("calculate", {"expression": "150 * 134"})]
    assert made_up["choices"][0]["message"]["content"] == "Step 1.\n"
    mixed = read_stated_calls(
        _answer(
            '<tool_call>\n{"name": "calculate", "arguments": {"expression": "3 * 52 * 40"}}\n</tool_call>\n'
            '<tool_call>\n{{"name": "calculate", "arguments": {"expression": "5 * 52 * 28"}}}\n</tool_call>\n'
            '<tool_call>\n{"name": "calculate", "arguments": {"expression": "2'
        )
    )
    assert mixed is not None and _calls(mixed) == [
        ("calculate", {"expression": "3 * 52 * 40"}),
        ("calculate", {"expression": "5 * 52 * 28"}),
    ]
    finished = read_stated_calls(
        _answer('<tool_call>\n4\n</tool_call>\n<tool_call>\n{"name": "calculate", "arguments": {"expression": "2+2"}}')
    )
    assert finished is not None and _calls(finished) == [("calculate", {"expression": "2+2"})]  # unclosed, whole


def test_anything_else_stays_as_it_came() -> None:
    broken = "<tool_call>\n{name: \"calculate\", \"arguments\": {'expression': '12944 / 4'}}\n</tool_call>"
    doubled = '<tool_call>\n{{"name": "calculate", "arguments": {"expression": "1+1"}}}\n</tool_call>'
    for content in (
        broken,  # not JSON in any form: the model's own mistake, a parse failure
        doubled + "\n" + broken,  # one unreadable block: the whole turn stays (as vLLM's parser does)
        '<tool_call>\n{"name": "calculate", "arguments": {"expression": "1+"\n</tool_call>',  # plain JSON, cut off
        '<tool_call>\n{{"name": "calculate", "arguments": "1+1"}}\n</tool_call>',  # arguments not an object
        '<tool_call>\n{{"name": "calculate", "arguments": {"expression": "1"}}} extra\n</tool_call>',
        "### ANSWER: 4 ###",
        "<tool_call>\n19100\n</tool_call>",  # no call at all, only a made-up result
        '<tool_call>\n{"name": "calculate", "argument": "4.0"}\n</tool_call>\n'  # other keys beside a call
        '<tool_call>\n{"name": "calculate", "arguments": {"expression": "1+1"}}\n</tool_call>',
        '<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>',  # the example
        '<tool_call>\n{"name": "calculate", "arguments": {"expression": "1"}} extra\n</tool_call>',  # text after JSON
        "",
        None,
    ):
        assert read_stated_calls(_answer(content)) is None, content
    parsed = _answer(
        None,
        "tool_calls",
        tool_calls=[{"id": "c", "type": "function", "function": {"name": "calculate", "arguments": "{}"}}],
    )
    assert read_stated_calls(parsed) is None  # vLLM read it already
    assert read_stated_calls({"choices": []}) is None and read_stated_calls({}) is None
