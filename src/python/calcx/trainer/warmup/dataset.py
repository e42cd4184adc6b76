"""The warm-up's dataset: agent traces tokenized as vLLM tokenizes the agent's own calls.

verl's `MultiTurnSFTDataset` renders each message on its own and joins the pieces. For calcx's
traces that is not what the policy sees during RL: Qwen's template joins consecutive tool answers
into one user turn, and vLLM parses a tool call's JSON `arguments` string into an object before
rendering (the template writes it with `tojson`, so an unparsed string would be quoted twice and
the model would learn to emit quoted arguments). Here each model turn is what one agent call
would produce: its prompt is the conversation so far rendered with the generation prompt, its
target the tokens up to and including the end-of-turn token. The row is the last call's prompt
and response, with every earlier turn's response inside the prompt and in the loss.

verl's SFT trainer loads it through `data.custom_cls` (calcx/trainer/config/warmup.yaml) with the
arguments it gives its own dataset class; rows come back unpadded (`pad_mode: no_padding`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import torch

from calcx.data.schema import DataError


def as_rendered(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as vLLM hands them to the chat template: tool-call arguments as objects, empty
    fields dropped (parquet stores absent keys as None)."""
    out = []
    for message in messages:
        item = {key: value for key, value in dict(message).items() if value is not None}
        if "tool_calls" in item:
            calls = []
            for call in item["tool_calls"]:
                call = dict(call)
                function = dict(call["function"])
                if isinstance(function.get("arguments"), str):
                    function["arguments"] = json.loads(function["arguments"])
                call["function"] = function
                calls.append(call)
            item["tool_calls"] = calls
        out.append(item)
    return out


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=generation_prompt, tokenize=False)


def model_turn_segments(tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Any) -> list[tuple[str, bool]]:
    """The trace's text cut into (text, trained) pieces: each assistant message's own tokens
    (content, tool calls, end-of-turn token) are trained; the rest is context. Raises DataError
    when the template does not render each call's prompt as a prefix of the conversation."""
    rendered = as_rendered(messages)
    segments: list[tuple[str, bool]] = []
    done = ""
    for index, message in enumerate(rendered):
        if message.get("role") != "assistant":
            continue
        prompt = _render(tokenizer, rendered[:index], tools, True)
        full = _render(tokenizer, rendered[: index + 1], tools, False)
        if not prompt.startswith(done) or not full.startswith(prompt):
            raise DataError(
                f"turn {index}: the chat template does not render this conversation's prompts as "
                "prefixes of one another; the trace cannot be trained as the agent's calls"
            )
        response = full[len(prompt) :]
        # the model's tokens end with its end-of-turn token; the line break a template writes
        # after it belongs to the next call's prompt
        cut = len(response.rstrip())
        segments.append((prompt[len(done) :], False))
        segments.append((response[:cut], True))
        done = prompt + response[:cut]
    if not segments:
        raise DataError("the trace has no assistant turn to train on")
    return segments


def tokenize_trace(tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Any) -> tuple[list[int], list[int]]:
    """(input ids, loss mask): each piece tokenized on its own, as a call's prompt is tokenized by
    vLLM and its response is the model's own tokens appended to it."""
    ids: list[int] = []
    mask: list[int] = []
    for text, trained in model_turn_segments(tokenizer, messages, tools):
        piece = tokenizer.encode(text, add_special_tokens=False)
        ids += piece
        mask += [int(trained)] * len(piece)
    return ids, mask


def _rows(value: Any) -> Any:
    """Parquet hands nested lists back as numpy arrays: plain lists, recursively."""
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        value = value.tolist()
    if isinstance(value, dict):
        return {key: _rows(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_rows(item) for item in value]
    return value


class AgentTraceDataset(torch.utils.data.Dataset):
    """`calcx data traces` rows for verl's SFT trainer, unpadded: input_ids, position_ids, loss_mask."""

    def __init__(
        self, parquet_files: Any, tokenizer: Any, config: Any, processor: Any = None, max_samples: int = -1
    ) -> None:
        import pyarrow.parquet as pq

        files = [parquet_files] if isinstance(parquet_files, str) else list(parquet_files)
        self.tokenizer = tokenizer
        self.messages_key = str(config.get("messages_key", "messages"))
        self.tools_key = str(config.get("tools_key", "tools"))
        self.max_length = int(config.get("max_length", 2048))
        rows: list[dict[str, Any]] = []
        for path in files:
            rows += pq.read_table(str(path)).to_pylist()
        if max_samples is not None and 0 < max_samples < len(rows):
            rows = rows[:max_samples]
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        row = self.rows[index]
        messages = _rows(row[self.messages_key])
        tools = _rows(row.get(self.tools_key))
        ids, mask = tokenize_trace(self.tokenizer, messages, tools)
        if len(ids) > self.max_length:
            raise DataError(f"trace {row.get('id', index)}: {len(ids)} tokens > data.max_length {self.max_length}")
        return {
            "input_ids": torch.tensor(ids, dtype=torch.long),
            "position_ids": torch.arange(len(ids), dtype=torch.long),
            "loss_mask": torch.tensor(mask, dtype=torch.long),
        }
