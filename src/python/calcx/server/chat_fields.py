"""The fields of an agent's chat completion request the gateway forwards: one table, `CHAT_FIELDS`.

The trainer trains on the recorded answers as the policy's own samples (their token ids and
log-probs), so an agent must not be able to change what is sampled: a field that would (a logit
bias, a minimum length, ignoring EOS, a grammar, a forced tool call, a scheduling priority) is
refused with a 400 `field_not_allowed` that names it and says why, and so is any field not in the
table (a new server-side option is refused until it is known to be harmless). The sampling
parameters a rollout can set (`calcx.api.models.Sampling`) are the agent's to choose only for a
rollout created without `sampling`; for one with it, the gateway forwards the rollout's values and
drops the agent's. The gateway sets the rest itself (model, token ids, log-probs, max_tokens
clamped, no streaming, one choice).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from calcx.api.models import Sampling
from calcx.server.errors import APIError


class Rule(str, Enum):
    FORWARD = "forwarded as the agent sent it"
    GATEWAY = "checked and set by the gateway"
    SAMPLING = "the agent's value for a rollout without sampling; the rollout's value (or none) for one with it"
    REFUSED = "refused: it changes what the policy samples, or how its requests are scheduled"


@dataclass(frozen=True)
class ChatField:
    rule: Rule
    #: FORWARD only: the values forwarded (None: any); any other value is refused with `why`
    values: tuple[Any, ...] | None = None
    why: str = ""


_FORCED_TOOL = "a forced tool call is decoded under a grammar, not sampled from the policy"

#: Every field of a chat completion request the gateway knows, and what it does with it; a field
#: not named here is refused.
CHAT_FIELDS: dict[str, ChatField] = {
    # the conversation, as the agent holds it
    "messages": ChatField(Rule.FORWARD),
    "tools": ChatField(Rule.FORWARD),
    "tool_choice": ChatField(Rule.FORWARD, ("auto", "none"), _FORCED_TOOL),
    "parallel_tool_calls": ChatField(Rule.FORWARD),
    "stop": ChatField(Rule.FORWARD),
    "user": ChatField(Rule.FORWARD),
    "response_format": ChatField(
        Rule.FORWARD,
        ({"type": "text"},),
        "a JSON object or schema format is decoded under a grammar, not sampled from the policy",
    ),
    # the gateway's own (Gateway.prepare)
    "model": ChatField(Rule.GATEWAY),
    "stream": ChatField(Rule.GATEWAY),
    "stream_options": ChatField(Rule.GATEWAY),
    "n": ChatField(Rule.GATEWAY),
    "max_tokens": ChatField(Rule.GATEWAY),
    "max_completion_tokens": ChatField(Rule.GATEWAY),
    "logprobs": ChatField(Rule.GATEWAY),
    "return_token_ids": ChatField(Rule.GATEWAY),
    # the sampling parameters a rollout may set
    **{name: ChatField(Rule.SAMPLING) for name in Sampling.model_fields},
    # known fields that change what is sampled (or when): OpenAI's and vLLM's
    **{
        name: ChatField(Rule.REFUSED)
        for name in (
            "logit_bias",
            "min_tokens",
            "ignore_eos",
            "priority",
            "bad_words",
            "allowed_token_ids",
            "logits_processors",
            "stop_token_ids",
            "length_penalty",
            "use_beam_search",
            "best_of",
            "structured_outputs",
            "guided_json",
            "guided_regex",
            "guided_choice",
            "guided_grammar",
            "guided_decoding_backend",
            "guided_whitespace_pattern",
            "prompt_logprobs",
            "top_logprobs",
            "echo",
            "add_generation_prompt",
            "continue_final_message",
            "chat_template",
            "chat_template_kwargs",
            "add_special_tokens",
            "truncate_prompt_tokens",
            "skip_special_tokens",
            "spaces_between_special_tokens",
            "include_stop_str_in_output",
            "return_tokens_as_token_ids",
            "functions",
            "function_call",
            "prediction",
            "reasoning_effort",
            "service_tier",
            "vllm_xargs",
            "kv_transfer_params",
            "cache_salt",
        )
    },
}

#: The fields forwarded as the agent sent them (in the order of the table), for messages.
FORWARDED: tuple[str, ...] = tuple(name for name, f in CHAT_FIELDS.items() if f.rule is Rule.FORWARD)
SAMPLING_FIELDS: frozenset[str] = frozenset(name for name, f in CHAT_FIELDS.items() if f.rule is Rule.SAMPLING)


def _refused(message: str) -> APIError:
    return APIError(400, "field_not_allowed", message)


def check_fields(body: dict[str, Any]) -> None:
    """400 `field_not_allowed` for the first field of `body` the gateway does not forward."""
    for name, value in body.items():
        field = CHAT_FIELDS.get(name)
        if field is None:
            raise _refused(
                f"{name!r} is not a field the calcx gateway forwards; it forwards {', '.join(FORWARDED)}, the "
                f"sampling parameters {', '.join(sorted(SAMPLING_FIELDS))} (a rollout's own sampling replaces "
                "them) and sets model, max_tokens, logprobs and stream itself"
            )
        if field.rule is Rule.REFUSED:
            raise _refused(
                f"{name!r} is refused by the calcx gateway: it changes what the policy samples (or how its "
                "requests are scheduled), and the recorded answer is trained as the policy's own sample"
            )
        if field.values is not None and value is not None and value not in field.values:
            raise _refused(
                f"{name}={value!r} is refused by the calcx gateway: {field.why}; send one of "
                f"{', '.join(repr(v) for v in field.values)} or leave it out"
            )
