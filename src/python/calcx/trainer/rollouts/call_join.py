"""A rollout's model calls as one sequence where their tokens continue each other.

Each recorded call is a sample with the whole conversation so far as its prompt. Where a call's
prompt tokens begin with the previous call's prompt and generated tokens (the gateway sends earlier
turns back as the model wrote them: calcx.server.assistant_turns), the two are one sequence: the
first prompt, then the first answer, the tokens between (the tool's answer and the next turn's
header: masked out, log-prob 0), then the second answer. The same answer tokens are trained with the
same context, a rollout is one row of its GRPO group instead of one row a call (so a rollout of four
calls no longer counts four times in its group's mean and deviation), and the step trains each
prompt once (what that saves on the tool-use agent's rollouts: benchmarks/RESULTS.md, "One
sequence a rollout"). This is the sequence verl's own ToolAgentLoop builds. A joined sample keeps
its first call's identity (call id, seq, policy version); the rollout's oldest and newest serving
versions, which verl's staleness reads, are the rollout's (translate), not the sample's.

Calls are kept apart where they do not continue each other (a template that renders a turn
differently from what the model generated), where a prompt was cut to max_prompt_length (its start
is gone), where an answer was cut to max_response_length, and where the joined answer would pass
max_response_length. Plain data: no verl, no torch.
"""

from __future__ import annotations

from dataclasses import replace

from calcx.common.tokens import continues
from calcx.trainer.rollouts.rollout_samples import CallSample, RolloutSamples


def _continues(sample: CallSample, after: CallSample) -> bool:
    return not (sample.prompt_truncated or after.prompt_truncated or after.response_truncated) and continues(
        sample.prompt_ids, after.prompt_ids, after.response_ids
    )


def _join(first: CallSample, then: CallSample, max_response_length: int) -> CallSample | None:
    """`first` (possibly already joined) followed by `then`, or None when they stay apart."""
    if not _continues(then, first):
        return None
    between = then.prompt_ids[len(first.prompt_ids) + len(first.response_ids) :]
    response_ids = first.response_ids + between + then.response_ids
    if len(response_ids) > max_response_length:
        return None
    return replace(
        first,
        response_ids=response_ids,
        response_mask=first.response_mask + [0] * len(between) + then.response_mask,
        response_logprobs=first.response_logprobs + [0.0] * len(between) + then.response_logprobs,
        latency_s=first.latency_s + then.latency_s,
        response_truncated=then.response_truncated,
        calls=first.calls + then.calls,
    )


def join_continued_calls(samples: RolloutSamples, *, max_response_length: int) -> RolloutSamples:
    """`samples` with each run of calls that continue each other joined into one sample."""
    merged: list[CallSample] = []
    for sample in samples.samples:
        joined = _join(merged[-1], sample, max_response_length) if merged else None
        if joined is None:
            merged.append(sample)
        else:
            merged[-1] = joined
    counters = dict(samples.counters)
    counters["calls_joined"] = counters.get("calls_joined", 0) + len(samples.samples) - len(merged)
    return replace(samples, samples=merged, counters=counters)
