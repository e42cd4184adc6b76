"""Calls a small model writes in the chat template's own doubled-brace example form are read as the
calls they state; anything else vLLM's hermes parser could not read stays as it came."""

from __future__ import annotations

import json
from typing import Any

from calcx.server.assistant_turns import read_template_calls


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
    first = read_template_calls(_answer(seen[0]))
    assert first is not None and _calls(first) == [("calculate", {"expression": "2 * 6 / 4"})]
    message = first["choices"][0]["message"]
    assert message["content"] == "<tools></tools>\n" and first["choices"][0]["finish_reason"] == "tool_calls"
    assert message["tool_calls"][0]["type"] == "function" and message["tool_calls"][0]["id"].startswith(
        "chatcmpl-tool-"
    )
    second = read_template_calls(_answer(seen[1]))
    assert second is not None and _calls(second) == [("calculate", {"expression": "72 - (12 * 3) + (7 * 3)"})]
    assert second["choices"][0]["message"]["content"] is None  # nothing before the call; the text after it goes
    assert second["choices"][0]["token_ids"] == [5, 6] and second["prompt_token_ids"] == [1]  # the model's tokens
    two = read_template_calls(
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
        "",
        None,
    ):
        assert read_template_calls(_answer(content)) is None, content
    parsed = _answer(
        None,
        "tool_calls",
        tool_calls=[{"id": "c", "type": "function", "function": {"name": "calculate", "arguments": "{}"}}],
    )
    assert read_template_calls(parsed) is None  # vLLM read it already
    assert read_template_calls({"choices": []}) is None and read_template_calls({}) is None
