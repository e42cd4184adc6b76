"""`calcx.reward` options: the bounded tool bonus, void turns out of the loss, and unreadable tool
calls trained as the agent's own mistake. Samples are made by `translate_rollout` from calls shaped
as the gateway records them; advantages by verl's own GRPO estimator."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
import torch

from calcx.api.models import Attempt, RecordedCall, Rollout
from calcx.trainer.config.compose import ComposeRequest, ConfigError, compose
from calcx.trainer.rollouts.reward_options import (
    RewardOptionError,
    RewardOptions,
    apply_reward_options,
    is_void_turn,
    shaped_reward,
)
from calcx.trainer.rollouts.tool_use import ToolUse, rollout_tool_use
from calcx.trainer.rollouts.translate import translate_rollout

USER = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
CALC = {"id": "c1", "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "6*7"}'}}


def _call(seq: int, messages: list, content: str | None, tool_calls: list | None = None) -> RecordedCall:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return RecordedCall(
        call_id=seq,
        rollout_id="r",
        seq=seq,
        attempt_id="a1",
        status_code=200,
        prompt_token_ids=[1, 2, 3],
        response_token_ids=[4, 5],
        response_logprobs=[-0.1, -0.2],
        request={"messages": messages},
        response={"choices": [{"message": message}]},
        latency_s=0.1,
        created_at=1.0,
    )


def _rollout(reward: float) -> Rollout:
    return Rollout(
        rollout_id="r",
        state="SUCCEEDED",
        group_id="g",
        reward=reward,
        row={},
        created_at=1.0,
        attempts=[Attempt(attempt_id="a1", state="SUCCEEDED", created_at=1.0)],
    )


def _samples(reward: float, calls: list[RecordedCall]):
    return translate_rollout(_rollout(reward), calls, max_prompt_length=64, max_response_length=64)


def tool_then_answer(answer_text: str = "### ANSWER: 42 ###") -> list[RecordedCall]:
    tool_msg = {"role": "tool", "tool_call_id": "c1", "content": "42"}
    return [
        _call(0, USER, None, [CALC]),
        _call(1, [*USER, {"role": "assistant", "tool_calls": [CALC]}, tool_msg], answer_text),
    ]


def test_options_default_off_and_bad_values_are_named() -> None:
    assert RewardOptions.from_config(None) == RewardOptions() and not RewardOptions().active
    assert RewardOptions.from_config({"tool_bonus": 0.5, "mask_void_turns": True}) == RewardOptions(0.5, True)
    for bad in (1.0, -0.1, "0.5", True, float("nan")):
        with pytest.raises(RewardOptionError, match="calcx.reward.tool_bonus"):
            RewardOptions.from_config({"tool_bonus": bad})
    with pytest.raises(RewardOptionError, match="calcx.reward.mask_void_turns"):
        RewardOptions.from_config({"mask_void_turns": "yes"})
    with pytest.raises(RewardOptionError, match="no option tool_bonsu"):
        RewardOptions.from_config({"tool_bonsu": 0.1})


def test_what_earns_the_bonus_is_a_call_unless_steps_are_asked_for() -> None:
    assert RewardOptions.from_config({"tool_bonus": 0.5}).tool_bonus_for == "call"
    assert RewardOptions.from_config({"tool_bonus_for": "steps"}) == RewardOptions(tool_bonus_for="steps")
    for bad in ("step", "Steps", "", 1, None, ["steps"]):
        with pytest.raises(RewardOptionError, match=r"calcx.reward.tool_bonus_for must be one of call, steps, not"):
            RewardOptions.from_config({"tool_bonus_for": bad})


def test_calcx_yaml_holds_the_options_off_and_compose_refuses_a_bad_one() -> None:
    cfg = compose(ComposeRequest())
    assert dict(cfg.calcx.reward) == {"tool_bonus": 0.0, "tool_bonus_for": "call", "mask_void_turns": False}
    assert RewardOptions.from_config(dict(cfg.calcx.reward)) == RewardOptions()
    assert compose(ComposeRequest(dotlist=["calcx.reward.tool_bonus=0.3"])).calcx.reward.tool_bonus == 0.3
    with pytest.raises(ConfigError, match="calcx.reward.tool_bonus must be a number in"):
        compose(ComposeRequest(dotlist=["calcx.reward.tool_bonus=1.5"]))
    with pytest.raises(ConfigError, match="calcx.reward.tool_bonus_for must be one of call, steps, not 'step'"):
        compose(ComposeRequest(dotlist=["calcx.reward.tool_bonus_for=step"]))


def test_bonus_orders_wrong_below_right_below_right_with_the_tool() -> None:
    options = RewardOptions(tool_bonus=0.4)
    used, unused = ToolUse(1, 1, 0), ToolUse(0, 0, 0)
    wrong_with_tool, wrong = shaped_reward(0.0, used, options), shaped_reward(0.0, unused, options)
    right, right_with_tool = shaped_reward(1.0, unused, options), shaped_reward(1.0, used, options)
    assert wrong_with_tool == wrong == 0.0 < right == 1.0 < right_with_tool == pytest.approx(1.4)
    assert shaped_reward(1.0, ToolUse(2, 0, 1), options) == 1.0  # calls that failed earn nothing
    assert shaped_reward(1.0, used, RewardOptions()) == 1.0  # off: today's recipe


def test_the_steps_rule_pays_the_share_of_the_reference_steps_computed() -> None:
    steps, call = RewardOptions(tool_bonus=0.4, tool_bonus_for="steps"), RewardOptions(tool_bonus=0.4)
    stamp, all_steps, none = ToolUse(1, 1, 0, 2, 1), ToolUse(2, 2, 0, 2, 2), ToolUse(1, 1, 0, 2, 0)
    assert shaped_reward(1.0, stamp, steps) == pytest.approx(1.2)  # one step of two: half the bonus
    assert shaped_reward(1.0, all_steps, steps) == pytest.approx(1.4)
    assert shaped_reward(1.0, none, steps) == 1.0  # a call that computed no step of the chain
    assert shaped_reward(1.0, stamp, call) == pytest.approx(1.4)  # the call rule: the whole bonus
    assert shaped_reward(1.0, ToolUse(2, 0, 1, 2, 0), steps) == 1.0  # calls that failed earn nothing
    for use in (stamp, all_steps, none):
        assert shaped_reward(0.0, use, steps) == shaped_reward(0.0, use, call) == 0.0  # wrong: never a bonus


def test_a_row_without_annotations_falls_back_to_the_call_rule() -> None:
    steps = RewardOptions(tool_bonus=0.4, tool_bonus_for="steps")
    assert shaped_reward(1.0, ToolUse(1, 1, 0, 0, 0), steps) == pytest.approx(1.4)
    assert shaped_reward(1.0, ToolUse(0, 0, 0, 0, 0), steps) == 1.0
    assert shaped_reward(0.0, ToolUse(1, 1, 0, 0, 0), steps) == 0.0


def test_the_steps_bonus_reaches_every_sample_of_the_rollout() -> None:
    """From the recorded calls and the row's chain to the samples' reward: the call answered 42 is
    one of the chain's two steps."""
    calls = tool_then_answer()
    chain = "6*7 = <<6*7=42>>42, and 42+0 = <<42+0=42.0>>42 ... then <<42/2=21>>21"
    use = rollout_tool_use(calls, chain)
    assert (use.reference_steps, use.steps_computed) == (2, 1)
    shaped = apply_reward_options(_samples(1.0, calls), calls, use, RewardOptions(0.5, tool_bonus_for="steps"))
    assert shaped.reward == 1.25 and [s.reward for s in shaped.samples] == [1.25, 1.25]
    by_call = apply_reward_options(_samples(1.0, calls), calls, use, RewardOptions(0.5))
    assert by_call.reward == 1.5


@pytest.mark.parametrize("rule", ["call", "steps"])
@pytest.mark.parametrize("bonus", [0.1, 0.5, 0.99])
def test_grpo_never_gives_a_wrong_answer_a_positive_advantage(bonus: float, rule: str) -> None:
    """Every group of 4 over {wrong, wrong + tool, right, right + tool}, through verl's estimator
    (`steps`: the tool's call computed one of four reference steps)."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    options = RewardOptions(tool_bonus=bonus, tool_bonus_for=rule)
    kinds = [(0.0, False), (0.0, True), (1.0, False), (1.0, True)]
    for group in itertools.product(kinds, repeat=4):
        scores = torch.zeros(4, 3)
        scores[:, -1] = torch.tensor(
            [shaped_reward(r, ToolUse(int(t), int(t), 0, 4, int(t)), options) for r, t in group]
        )
        adv, _ = compute_grpo_outcome_advantage(scores, torch.ones(4, 3), np.array(["g"] * 4, dtype=object))
        per_row = adv[:, 0].tolist()
        for (reward, _tool), value in zip(group, per_row):
            if reward == 0.0:
                assert value <= 1e-6, (group, per_row)
        right_tool = [v for (r, t), v in zip(group, per_row) if r == 1.0 and t]
        right_plain = [v for (r, t), v in zip(group, per_row) if r == 1.0 and not t]
        if right_tool and right_plain:
            assert min(right_tool) > max(right_plain), (group, per_row)


def test_bonus_reaches_every_sample_of_a_right_rollout_with_a_successful_call() -> None:
    calls = tool_then_answer()
    samples = _samples(1.0, calls)
    shaped = apply_reward_options(samples, calls, rollout_tool_use(calls), RewardOptions(tool_bonus=0.25))
    assert shaped.reward == 1.25 and [s.reward for s in shaped.samples] == [1.25, 1.25]
    assert [s.reward for s in samples.samples] == [1.0, 1.0]  # the input is left as it was
    assert apply_reward_options(samples, calls, rollout_tool_use(calls), RewardOptions()) is samples


def test_an_unreadable_tool_call_is_the_agents_own_failure() -> None:
    """vLLM's parser left the `<tool_call>` as text: the rollout is trained with the agent's reward
    (not left out as incomplete), counted as a parse failure, and earns no bonus."""
    broken = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "6*7"</tool_call>'
    # the second call carries the first's text back (a request repeated word for word would be a resend)
    calls = [_call(0, USER, broken), _call(1, [*USER, {"role": "assistant", "content": broken}], "### ANSWER: 42 ###")]
    use = rollout_tool_use(calls)
    assert use == ToolUse(calls=0, successful=0, parse_failures=1)
    samples = _samples(1.0, calls)  # no RolloutIncomplete
    shaped = apply_reward_options(samples, calls, use, RewardOptions(tool_bonus=0.5, mask_void_turns=True))
    assert [s.reward for s in shaped.samples] == [1.0, 1.0]
    assert [s.response_mask for s in shaped.samples] == [
        [1, 1],
        [1, 1],
    ]  # a tool call, even a broken one, is no void turn


def test_void_turns_leave_the_loss() -> None:
    musing = [USER[0], {"role": "user", "content": "q, asked before the agent's retry"}]  # not a resend of USER
    calls = [
        _call(0, musing, "Let me think about the clips."),
        *[c.model_copy(update={"call_id": c.seq + 1, "seq": c.seq + 1}) for c in tool_then_answer("So it is 42.")],
    ]
    samples = _samples(0.0, calls)
    shaped = apply_reward_options(samples, calls, rollout_tool_use(calls), RewardOptions(mask_void_turns=True))
    # the musing turn and the closing turn without ### ANSWER are out; the tool call stays in
    assert [s.response_mask for s in shaped.samples] == [[0, 0], [1, 1], [0, 0]]
    assert shaped.counters["void_turns_masked"] == 2 and [s.reward for s in shaped.samples] == [0.0] * 3
    assert shaped.counters["void_rollouts_kept"] == 0
    assert not is_void_turn({"choices": [{"message": {"content": "### ANSWER: 7 ###"}}]})
    assert is_void_turn({"choices": [{"message": {"content": "", "tool_calls": []}}]})


def test_a_rollout_of_only_void_turns_keeps_them_in_the_loss() -> None:
    """Masking them all would leave the rollout without a trained token (verl's token-mean loss
    over such rows divides by zero); it never answered, so it trains as the wrong answer it is."""
    musing = [USER[0], {"role": "user", "content": "q, asked again"}]
    calls = [_call(0, USER, "Let me think about the clips."), _call(1, musing, "So it is probably 42.")]
    samples = _samples(0.0, calls)
    shaped = apply_reward_options(samples, calls, rollout_tool_use(calls), RewardOptions(mask_void_turns=True))
    assert [s.response_mask for s in shaped.samples] == [[1, 1], [1, 1]]
    assert shaped.counters["void_turns_masked"] == 0 and shaped.counters["void_rollouts_kept"] == 1
    [alone] = calls[:1]
    single = apply_reward_options(
        _samples(0.0, [alone]), [alone], rollout_tool_use([alone]), RewardOptions(mask_void_turns=True)
    )
    assert [s.response_mask for s in single.samples] == [[1, 1]] and single.counters["void_rollouts_kept"] == 1
    assert all(any(s.response_mask) for s in shaped.samples + single.samples)
