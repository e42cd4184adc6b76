"""Calls that continue each other become one sample (calcx.trainer.rollouts.call_join): the first prompt, the
answers with the tokens between them masked out, the rollout's reward; calls that do not continue
each other, or were cut, stay apart."""

from __future__ import annotations

from dataclasses import replace

from calcx.trainer.rollouts.call_join import join_continued_calls
from calcx.trainer.rollouts.rollout_samples import CallSample, RolloutSamples


def call(n: int, prompt: list[int], response: list[int], **kw) -> CallSample:
    return CallSample(
        call_id=f"c{n}",
        seq=n,
        prompt_ids=prompt,
        response_ids=response,
        response_mask=[1] * len(response),
        response_logprobs=[-0.5] * len(response),
        reward=1.0,
        policy_version=3,
        latency_s=0.25,
        **kw,
    )


def rollout(*samples: CallSample) -> RolloutSamples:
    return RolloutSamples(
        rollout_id="r",
        group_id="g",
        attempt_id="1",
        reward=1.0,
        samples=list(samples),
        counters={"prompt_truncated": 0},
    )


SYSTEM, ANSWER_1, TOOL, ANSWER_2, ANSWER_3 = [1, 2, 3], [10, 11], [20, 21, 22], [30], [40, 41]
# three calls, each prompt the previous prompt, its answer and the tool's answer
CALLS = (
    call(0, SYSTEM, ANSWER_1),
    call(1, SYSTEM + ANSWER_1 + TOOL, ANSWER_2),
    call(2, SYSTEM + ANSWER_1 + TOOL + ANSWER_2 + TOOL, ANSWER_3),
)


def test_calls_that_continue_each_other_become_one_sequence() -> None:
    joined = join_continued_calls(rollout(*CALLS), max_response_length=100)
    [one] = joined.samples
    assert one.prompt_ids == SYSTEM
    assert one.response_ids == ANSWER_1 + TOOL + ANSWER_2 + TOOL + ANSWER_3
    assert one.response_mask == [1, 1, 0, 0, 0, 1, 0, 0, 0, 1, 1]
    assert one.response_logprobs == [-0.5, -0.5, 0.0, 0.0, 0.0, -0.5, 0.0, 0.0, 0.0, -0.5, -0.5]
    assert one.calls == 3 and one.reward == 1.0 and one.latency_s == 0.75 and one.call_id == "c0"
    # the sequence is the last call's prompt and answer: the same tokens the last call saw
    assert one.prompt_ids + one.response_ids == CALLS[2].prompt_ids + CALLS[2].response_ids
    assert joined.counters == {"prompt_truncated": 0, "calls_joined": 2}


def test_a_call_that_does_not_continue_the_last_starts_a_new_sample() -> None:
    rendered_again = call(1, SYSTEM + [12] + TOOL, ANSWER_2)  # the first answer tokenized differently
    joined = join_continued_calls(
        rollout(CALLS[0], rendered_again, call(2, rendered_again.prompt_ids + ANSWER_2, [5])), max_response_length=100
    )
    assert [s.calls for s in joined.samples] == [1, 2]
    assert joined.samples[0] == CALLS[0]
    assert joined.samples[1].prompt_ids == rendered_again.prompt_ids and joined.samples[1].response_mask == [1, 1]
    assert joined.counters["calls_joined"] == 1


def test_cut_calls_and_answers_past_the_bound_stay_apart() -> None:
    # the joined answer would be 2 + 3 + 1 = 6 tokens
    assert len(join_continued_calls(rollout(*CALLS[:2]), max_response_length=5).samples) == 2
    assert len(join_continued_calls(rollout(*CALLS[:2]), max_response_length=6).samples) == 1
    cut_answer = replace(CALLS[0], response_truncated=True)
    assert len(join_continued_calls(rollout(cut_answer, CALLS[1]), max_response_length=100).samples) == 2
    cut_prompt = replace(CALLS[1], prompt_truncated=True)
    assert len(join_continued_calls(rollout(CALLS[0], cut_prompt), max_response_length=100).samples) == 2


def test_a_masked_turn_stays_masked_inside_the_sequence() -> None:
    # mask_void_turns zeroes a turn's mask before the join (calcx.trainer.rollouts.session)
    void = replace(CALLS[1], response_mask=[0])
    [one] = join_continued_calls(rollout(CALLS[0], void, CALLS[2]), max_response_length=100).samples
    assert one.response_mask == [1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1]


def test_one_call_is_left_as_it_is() -> None:
    joined = join_continued_calls(rollout(CALLS[0]), max_response_length=100)
    assert joined.samples == [CALLS[0]] and joined.counters["calls_joined"] == 0
