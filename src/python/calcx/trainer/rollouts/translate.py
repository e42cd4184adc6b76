"""Turn a finished rollout and its recorded model calls into per-call training samples.

Pure functions over the API's models (`Rollout`, `RecordedCall`, as the client parsed them; no
verl, no torch, no ray) so that the rules that decide what is trained on can be tested anywhere:
only the latest attempt's calls count, a call the agent's client sent again (the same request twice
in one attempt) counts once, with its last answer, each call is one sample (prompt ids, response
ids, mask of ones, log-probs), every sample of a rollout carries the rollout's reward, and a rollout
that cannot be trained on faithfully raises `RolloutIncomplete` instead of being turned into a
reward of 0.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from calcx.api.models import RecordedCall, Rollout
from calcx.contract.labels import scored_reward
from calcx.trainer.rollouts.rollout_samples import CallSample, RolloutIncomplete, RolloutSamples


def _resent(ordered: Sequence[RecordedCall]) -> set[int]:
    """Indexes of calls whose request a later call of the attempt repeats: the client sent it
    again and went on with the later answer, so only that one is trained."""
    last: dict[str, int] = {}
    for index, call in enumerate(ordered):
        last[json.dumps(call.request, sort_keys=True)] = index
    return set(range(len(ordered))) - set(last.values())


def translate_rollout(
    rollout: Rollout,
    calls: Sequence[RecordedCall],
    *,
    max_prompt_length: int,
    max_response_length: int,
    expected_group_id: str | None = None,
) -> RolloutSamples:
    """(Rollout, recorded calls) -> samples, or `RolloutIncomplete` saying why not.

    Calls are ordered by `seq`; calls of earlier (failed) attempts, calls that did not answer 200
    and calls that generated no token are skipped. Prompts longer than `max_prompt_length` keep
    their last tokens (the end of the conversation is what the response depends on); responses
    longer than `max_response_length` are cut, with the mask and log-probs cut alike.
    """
    rollout_id = rollout.rollout_id
    reward, attempt_id = _trainable_verdict(rollout, rollout_id, expected_group_id)
    ordered, skipped = _latest_attempt_calls(calls, attempt_id)
    samples: list[CallSample] = []
    counters = {"prompt_truncated": 0, "response_truncated": 0}
    for call in ordered:
        sample = _call_sample(call, rollout_id, reward, max_prompt_length, max_response_length, counters)
        if sample is None:
            skipped += 1
        else:
            samples.append(sample)
    if not samples:
        raise RolloutIncomplete(rollout_id, "no_calls", f"attempt {attempt_id} recorded no usable model call")
    versions = [s.policy_version for s in samples if s.policy_version is not None]
    return RolloutSamples(
        rollout_id=rollout_id,
        group_id=rollout.group_id,
        attempt_id=attempt_id,
        reward=reward,
        samples=samples,
        skipped_calls=skipped,
        min_policy_version=min(versions) if versions else None,
        max_policy_version=max(versions) if versions else None,
        counters=counters,
    )


def _trainable_verdict(rollout: Rollout, rollout_id: str, expected_group_id: str | None) -> tuple[float, str]:
    """(reward, latest attempt id) of a rollout that may be trained on: SUCCEEDED, of the expected
    group, scored, with attempts; else `RolloutIncomplete` saying which of these it is not."""
    state, attempts = rollout.state, rollout.attempts
    if state != "SUCCEEDED":
        reason = attempts[-1].reason if attempts else None
        raise RolloutIncomplete(rollout_id, "rollout_failed", f"state {state}, last failure {reason}")
    if expected_group_id is not None and rollout.group_id != expected_group_id:
        raise RolloutIncomplete(
            rollout_id, "wrong_group", f"group {rollout.group_id!r}, expected {expected_group_id!r}"
        )
    reward = scored_reward(state, rollout.reward)
    if reward is None:
        raise RolloutIncomplete(rollout_id, "no_reward", f"reward {rollout.reward!r}")
    if not attempts:
        raise RolloutIncomplete(rollout_id, "bad_rollout_record", "SUCCEEDED without attempts")
    return reward, attempts[-1].attempt_id


def _latest_attempt_calls(calls: Sequence[RecordedCall], attempt_id: str) -> tuple[list[RecordedCall], int]:
    """(the latest attempt's calls by `seq`, less those sent again; how many calls were left out)."""
    ordered = sorted((c for c in calls if c.attempt_id == attempt_id), key=lambda c: c.seq)
    resent = _resent(ordered)
    skipped = sum(1 for c in calls if c.attempt_id != attempt_id) + len(resent)
    return [call for index, call in enumerate(ordered) if index not in resent], skipped


def _call_sample(
    call: RecordedCall,
    rollout_id: str,
    reward: float,
    max_prompt_length: int,
    max_response_length: int,
    counters: dict[str, int],
) -> CallSample | None:
    """One call's sample, cut to the lengths (counted in `counters`); None for a call that is
    skipped (not answered 200, no token generated); `RolloutIncomplete` for a broken record."""
    if call.status_code != 200:
        return None
    call_id = str(call.call_id)
    prompt_ids, response_ids, logprobs = call.prompt_token_ids, call.response_token_ids, call.response_logprobs
    if not response_ids:
        return None
    if not prompt_ids:
        raise RolloutIncomplete(rollout_id, "bad_call_record", f"call {call_id} has no prompt token ids")
    if len(logprobs) != len(response_ids):
        raise RolloutIncomplete(
            rollout_id,
            "bad_call_record",
            f"call {call_id}: {len(logprobs)} log-probs for {len(response_ids)} response tokens",
        )
    prompt_truncated = len(prompt_ids) > max_prompt_length
    response_truncated = len(response_ids) > max_response_length
    if prompt_truncated:
        prompt_ids = prompt_ids[-max_prompt_length:]
        counters["prompt_truncated"] += 1
    if response_truncated:
        response_ids = response_ids[:max_response_length]
        logprobs = logprobs[:max_response_length]
        counters["response_truncated"] += 1
    return CallSample(
        call_id=call_id,
        seq=call.seq,
        prompt_ids=list(prompt_ids),
        response_ids=list(response_ids),
        response_mask=[1] * len(response_ids),
        response_logprobs=list(logprobs),
        reward=reward,
        policy_version=call.policy_version,
        latency_s=call.latency_s,
        prompt_truncated=prompt_truncated,
        response_truncated=response_truncated,
    )
