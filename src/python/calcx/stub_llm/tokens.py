"""Deterministic token ids and log-probs, shaped like vLLM's extras.

The stub has no real tokenizer; it splits text into words, punctuation and
whitespace runs and hashes each piece to an id. The same text always gives the
same ids, which is all a gateway or trainer test needs to check its bookkeeping.
"""

from __future__ import annotations

import json
import re
import zlib
from typing import Any

SPECIAL_TOKENS = {"<|im_start|>": 1, "<|im_end|>": 2, "<tool_call>": 3, "</tool_call>": 4}
VOCAB_OFFSET = 1000
VOCAB_SIZE = 150_000
_TOKEN_RE = re.compile(r"<\|[a-z_]+\|>|</?tool_call>|\w+|[^\w\s]|\s+")


def split_tokens(text: str) -> list[str]:
    """The token strings of ``text`` (concatenated, they give ``text`` back)."""
    return _TOKEN_RE.findall(text)


def token_id(token: str) -> int:
    special = SPECIAL_TOKENS.get(token)
    if special is not None:
        return special
    return VOCAB_OFFSET + zlib.crc32(token.encode("utf-8")) % VOCAB_SIZE


def encode(text: str) -> list[int]:
    return [token_id(t) for t in split_tokens(text)]


def token_logprob(token: str, position: int) -> float:
    """A made-up but fixed log-prob in (-3, 0) for ``token`` at ``position``."""
    return -((zlib.crc32(f"{position}:{token}".encode()) % 3000) + 1) / 1000.0


def content_text(content: Any) -> str:
    """Text of an OpenAI message ``content`` (a string or a list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    return str(content)


def render_tool_calls(tool_calls: list[dict]) -> str:
    rendered = []
    for call in tool_calls:
        function = call.get("function") or {}
        rendered.append(
            "<tool_call>\n"
            + json.dumps({"name": function.get("name"), "arguments": function.get("arguments")}, sort_keys=True)
            + "\n</tool_call>"
        )
    return "\n".join(rendered)


def render_prompt(messages: list[dict], tools: list[dict] | None) -> str:
    """A ChatML-like rendering of the request: what the prompt token ids are computed from."""
    pieces = []
    if tools:
        pieces.append("<|im_start|>tools\n" + json.dumps(tools, sort_keys=True) + "<|im_end|>\n")
    for message in messages:
        role = str(message.get("role", "user"))
        text = content_text(message.get("content"))
        if message.get("tool_calls"):
            text = (text + "\n" if text else "") + render_tool_calls(message["tool_calls"])
        pieces.append(f"<|im_start|>{role}\n{text}<|im_end|>\n")
    pieces.append("<|im_start|>assistant\n")
    return "".join(pieces)


def logprobs_block(text: str, top_logprobs: int = 0) -> dict:
    """OpenAI-style ``choice.logprobs``: one entry per response token."""
    entries = []
    for position, token in enumerate(split_tokens(text)):
        logprob = token_logprob(token, position)
        entry: dict[str, Any] = {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}
        entry["top_logprobs"] = (
            [{"token": token, "logprob": logprob, "bytes": entry["bytes"]}] if top_logprobs > 0 else []
        )
        entries.append(entry)
    return {"content": entries}
