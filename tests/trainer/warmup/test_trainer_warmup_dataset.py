"""The warm-up dataset trains each model turn as the agent's call produces it: the prompt as the
chat template renders the conversation so far, the response up to its end-of-turn token."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from byte_tokenizer import byte_tokenizer

from calcx.agent.calculator_inprocess import calculator_tool_entry
from calcx.data.schema import DataError
from calcx.data.traces import build_trace, write_traces
from calcx.trainer.warmup.dataset import AgentTraceDataset, as_rendered, model_turn_segments, tokenize_trace

# Qwen2.5's way with tools, cut to what matters here: consecutive tool answers share one user turn,
# and a call's arguments are written with `tojson` (an object stays an object, a string is quoted).
QWEN_LIKE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' + messages[0].content + '\\n<tools>' }}"
    "{%- for tool in tools %}{{- tool | tojson }}{%- endfor %}{{- '</tools><|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}"
    "{%- if not tools %}{{- '<|im_start|>system\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif message.role == 'user' %}{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    '{%- for call in message.tool_calls or [] %}{{- \'\\n<tool_call>\\n{"name": "\' + call.function.name }}'
    "{{- '\", \"arguments\": ' }}{{- call.function.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture(scope="module")
def qwen_like():
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = QWEN_LIKE
    return tokenizer


@pytest.fixture(scope="module")
def trace():
    row = {
        "id": "gsm8k-train-1",
        "question": "Natalia sold 48 clips in April and half as many in May. How many?",
        "chain": "In May she sold 48/2 = <<48/2=24>>24.\nAltogether 48+24 = <<48+24=72>>72.",
        "result": "72",
    }
    trace, calls = asyncio.run(build_trace(row, [calculator_tool_entry()]))
    assert calls == 2
    return trace


@pytest.fixture(scope="module")
def sequential_trace():
    """The shape of an agent of several tool rounds: one call a turn, each after the last result."""
    row = {
        "id": "gsm8k-train-2",
        "question": "Ana has 48 clips, sells half, then buys 10. How many now?",
        "chain": "She sells 48/2 = <<48/2=24>>24.\nShe keeps 48-24 = <<48-24=24>>24.\n"
        "Then 24+10 = <<24+10=34>>34 clips.",
        "result": "34",
    }
    trace, calls = asyncio.run(build_trace(row, [calculator_tool_entry()], tool_rounds=4))
    assert calls == 3
    return trace


def trained_spans(mask):
    spans, start = [], None
    for position, flag in enumerate(mask + [0]):
        if flag and start is None:
            start = position
        if not flag and start is not None:
            spans.append((start, position))
            start = None
    return spans


def trained_and_context(tokenizer, trace):
    ids, mask = tokenize_trace(tokenizer, trace["messages"], trace["tools"])
    trained = tokenizer.decode([i for i, m in zip(ids, mask) if m], skip_special_tokens=False)
    return ids, mask, trained


def test_tool_call_arguments_are_rendered_as_objects_as_vllm_hands_them_over(qwen_like, trace):
    _, _, trained = trained_and_context(qwen_like, trace)
    assert '"arguments": {"expression": "48/2"}' in trained
    assert '"arguments": {"expression": "48+24"}' in trained
    assert '\\"expression\\"' not in trained  # a JSON string quoted a second time
    calls = [m for m in as_rendered(trace["messages"]) if m.get("tool_calls")]
    assert calls[0]["tool_calls"][0]["function"]["arguments"] == {"expression": "48/2"}


@pytest.mark.parametrize("template", ["qwen_like", "hermes"])
def test_each_model_turn_is_one_call_prompt_then_its_response(request, trace, template):
    tokenizer = request.getfixturevalue("qwen_like") if template == "qwen_like" else byte_tokenizer()
    ids, mask, _ = trained_and_context(tokenizer, trace)
    rendered = as_rendered(trace["messages"])
    turns = [i for i, m in enumerate(rendered) if m["role"] == "assistant"]
    assert len(turns) == 2
    # the trained spans, in order, are exactly the two responses; each starts where that call's
    # prompt (the conversation so far with the generation prompt) ends
    spans = trained_spans(mask)
    assert len(spans) == 2
    for (begin, end), turn in zip(spans, turns):
        prompt = tokenizer.apply_chat_template(
            rendered[:turn], tools=trace["tools"], add_generation_prompt=True, tokenize=False
        )
        full = tokenizer.apply_chat_template(rendered[: turn + 1], tools=trace["tools"], tokenize=False)
        assert tokenizer.decode(ids[:begin], skip_special_tokens=False) == prompt
        response = tokenizer.decode(ids[begin:end], skip_special_tokens=False)
        assert response.endswith("<|im_end|>")
        assert full.startswith(prompt + response)
        assert full[len(prompt + response) :].strip() == ""  # only the newline after the turn is context
    final = tokenizer.decode(ids[spans[1][0] : spans[1][1]], skip_special_tokens=False)
    assert "### ANSWER: 72 ###" in final


def test_consecutive_tool_answers_stay_one_user_turn_as_in_the_agents_calls(qwen_like, trace):
    ids, mask, _ = trained_and_context(qwen_like, trace)
    context = qwen_like.decode([i for i, m in zip(ids, mask) if not m], skip_special_tokens=False)
    assert context.count("<|im_start|>user") == 2  # the question, then both tool answers together
    assert "<tool_response>\n24.0\n</tool_response>\n<tool_response>\n72\n</tool_response><|im_end|>" in context


def test_a_template_whose_prompts_are_not_prefixes_is_refused(trace):
    tokenizer = byte_tokenizer()
    # writes how many messages there are at the top: each call's prompt differs from the last
    tokenizer.chat_template = "{{ messages | length }}" + tokenizer.chat_template
    with pytest.raises(DataError, match="prefixes"):
        model_turn_segments(tokenizer, trace["messages"], trace["tools"])


def test_a_trace_without_a_model_turn_is_refused(qwen_like, trace):
    with pytest.raises(DataError, match="no assistant turn"):
        model_turn_segments(qwen_like, trace["messages"][:2], trace["tools"])


def test_the_dataset_reads_the_traces_file_and_bounds_its_rows(tmp_path: Path, qwen_like, trace):
    path = write_traces([trace, {**trace, "id": "gsm8k-train-2"}], tmp_path / "traces.parquet")
    data = AgentTraceDataset(str(path), qwen_like, {"max_length": 4096}, max_samples=1)
    assert len(data) == 1
    item = data[0]
    assert item["input_ids"].shape == item["loss_mask"].shape == item["position_ids"].shape
    assert item["position_ids"].tolist() == list(range(len(item["input_ids"])))
    ids, mask = tokenize_trace(qwen_like, json.loads(json.dumps(trace["messages"])), trace["tools"])
    assert item["input_ids"].tolist() == ids and item["loss_mask"].tolist() == mask
    short = AgentTraceDataset([str(path)], qwen_like, {"max_length": 100})
    with pytest.raises(DataError, match="gsm8k-train-1: .* tokens > data.max_length 100"):
        short[0]


@pytest.mark.parametrize("template", ["qwen_like", "hermes"])
def test_every_turn_of_a_sequential_trace_is_trained_as_its_own_call(request, sequential_trace, template):
    """Three calls, one a turn, then the answer: four trained spans, each the response to a prompt
    that already holds every earlier call and its result."""
    tokenizer = request.getfixturevalue("qwen_like") if template == "qwen_like" else byte_tokenizer()
    ids, mask, _ = trained_and_context(tokenizer, sequential_trace)
    rendered = as_rendered(sequential_trace["messages"])
    turns = [i for i, m in enumerate(rendered) if m["role"] == "assistant"]
    spans = trained_spans(mask)
    assert len(turns) == len(spans) == 4
    responses = []
    for (begin, end), turn in zip(spans, turns):
        prompt = tokenizer.apply_chat_template(
            rendered[:turn], tools=sequential_trace["tools"], add_generation_prompt=True, tokenize=False
        )
        full = tokenizer.apply_chat_template(rendered[: turn + 1], tools=sequential_trace["tools"], tokenize=False)
        assert tokenizer.decode(ids[:begin], skip_special_tokens=False) == prompt
        response = tokenizer.decode(ids[begin:end], skip_special_tokens=False)
        assert response.endswith("<|im_end|>") and full.startswith(prompt + response)
        assert full[len(prompt + response) :].strip() == ""
        responses.append(response)
    # each call turn is the text since the last result and one call on it; the results are context
    assert "She sells 48/2 =" in responses[0] and '"expression": "48/2"' in responses[0]
    assert responses[1].count("<tool_call>") == 1 and '"expression": "48-24"' in responses[1]
    assert "24.\nShe keeps 48-24 =" in responses[1]
    assert '"expression": "24+10"' in responses[2] and "### ANSWER: 34 ###" in responses[3]
    assert not any("<tool_response>" in r for r in responses)
    context = tokenizer.decode([i for i, m in zip(ids, mask) if not m], skip_special_tokens=False)
    assert all(f"<tool_response>\n{value}\n</tool_response>" in context for value in ("24.0", "24", "34"))
    assert sum(mask) == sum(len(tokenizer.encode(r, add_special_tokens=False)) for r in responses)
