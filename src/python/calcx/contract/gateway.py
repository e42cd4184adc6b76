"""What the gateway tells an agent beyond OpenAI's own answers.

A model call refused because the conversation no longer fits the model's context is the policy's
own doing (it wrote too much over its tool rounds), not the model endpoint failing: the agent
ends its run with no answer, scored 0, instead of failing the attempt as `model_unreachable`,
which the controller would retry and the trainer leave out. The gateway hands such a refusal on
with OpenAI's code for it, whatever its upstream's wording; the agent knows either form.
"""

from __future__ import annotations

from typing import Any

#: the error code of a 400 whose request outgrew the model's context (OpenAI's own name)
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
#: how vLLM words that refusal (its 400 carries no code of its own), case folded: its OpenAI
#: server's check ("This model's maximum context length is 4096 tokens. However, you requested ...",
#: as an H200 run's store holds it) and its engine's ("... is longer than the maximum model length of ...")
UPSTREAM_CONTEXT_PHRASES = ("maximum context length", "longer than the maximum model length")


def context_refused(status: int, error: Any) -> bool:
    """Whether an answer of HTTP ``status`` with ``error`` (the body's `error` object) refuses the
    call because the conversation outgrew the model's context."""
    if status != 400 or not isinstance(error, dict):
        return False
    message = str(error.get("message")).lower()
    return error.get("code") == CONTEXT_LENGTH_EXCEEDED or any(phrase in message for phrase in UPSTREAM_CONTEXT_PHRASES)
