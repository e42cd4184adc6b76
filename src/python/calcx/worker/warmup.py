"""Fill the lazy per-process caches of the agent's libraries in the zygote, before forking.

Profiling a forked agent showed ~100 ms of CPU per rollout spent rebuilding things every
fresh process builds once: pydantic models whose schema is deferred until first use (~650 of
openai's types) and openai's cached type hints of request parameters. Done once in the zygote,
every child inherits them (copy-on-write) instead of paying again. Each step is best effort:
a library that changed shape only costs the saving, never a failure.
"""

from __future__ import annotations

import sys
import time
from typing import Any


def complete_pydantic_models() -> int:
    """Build the schema of every imported pydantic model whose build was deferred."""
    try:
        import pydantic
    except ImportError:
        return 0
    seen: set[type[pydantic.BaseModel]] = set()
    stack: list[type[pydantic.BaseModel]] = [pydantic.BaseModel]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in seen:
                seen.add(sub)
                stack.append(sub)
    built = 0
    for model in seen:
        if model.__dict__.get("__pydantic_complete__", True):
            continue
        try:
            model.model_rebuild()
            built += 1
        except Exception:  # noqa: BLE001 - e.g. a forward reference that only resolves later
            continue
    return built


_SAMPLE_CHAT_REQUEST: dict[str, Any] = {
    "messages": [
        {"role": "system", "content": "You are a careful math assistant."},
        {"role": "user", "content": "What is 2 + 3?", "name": "user"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "calculate", "arguments": '{"expression": "2 + 3"}'},
                }
            ],
        },
        {"role": "tool", "content": "5", "tool_call_id": "call_0"},
    ],
    "model": "warmup",
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "calculate",
                "description": "Calculates/evaluates the given expression.",
                "parameters": {
                    "type": "object",
                    "properties": {"expression": {"type": "string"}},
                    "required": ["expression"],
                },
                "strict": False,
            },
        }
    ],
    "stream": False,
    "max_tokens": 16,
    "temperature": 1.0,
}


def warm_openai_transforms() -> bool:
    """Walk a typical chat-completions request through openai's parameter transform once."""
    try:
        from openai._utils._transform import transform
        from openai.types.chat import completion_create_params
    except ImportError:
        return False
    try:
        transform(_SAMPLE_CHAT_REQUEST, completion_create_params.CompletionCreateParamsNonStreaming)
        transform(_SAMPLE_CHAT_REQUEST, completion_create_params.CompletionCreateParamsBase)
    except Exception:  # noqa: BLE001
        return False
    return True


def warm_all() -> dict[str, Any]:
    """Run every warm-up step; returns what it did and how long it took (for the log)."""
    t0 = time.perf_counter()
    report: dict[str, Any] = {"openai_transform": warm_openai_transforms()}
    report["pydantic_models_built"] = complete_pydantic_models()
    report["seconds"] = round(time.perf_counter() - t0, 3)
    return report


if __name__ == "__main__":  # pragma: no cover - manual check
    print(warm_all(), file=sys.stderr)
