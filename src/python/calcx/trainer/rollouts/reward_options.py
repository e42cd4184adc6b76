"""Reward options for training rollouts (`calcx.reward` in calcx.yaml), all off by default.

The agent posts the answer's reward (1 right, 0 wrong); these options change only what a training
rollout's samples are trained with, never validation (its accuracy stays the agent's reward):

- `tool_bonus` (AdaTIR-style): a right answer whose rollout made at least one successful calculator
  call gets `1 + tool_bonus`. Only right answers get it, and it is below 1, so
  wrong (0) < right without the tool (1) < right with it (1 + bonus): a wrong answer stays the
  lowest reward of its GRPO group and its advantage never turns positive.
- `tool_bonus_for`: what earns the bonus. `call` (the default): any successful call, the whole
  bonus. `steps`: the share of the row's reference steps (the distinct results of its GSM8K
  annotations) that the rollout's successful calls returned, `1 + tool_bonus * computed / steps`,
  so one call stamping the last trivial step of a worked-out answer earns a fraction, not all of
  it; a row without annotations falls back to the `call` rule.
- `mask_void_turns` (SimpleTIR-style): a model turn with neither a tool call (parsed or not) nor the
  `### ANSWER` marker is left out of the loss (its response mask is zeros); the rollout's other
  turns keep its reward and advantage. A rollout whose every turn is void keeps them all: it never
  answered, so it is trained as the wrong answer it is, and no rollout reaches verl without a single
  trained token (a group or micro-batch of such rows would divide verl's token-mean loss by zero).

A tool call the parser could not read is the model's mistake: the rollout is trained with the
agent's reward like any other (no bonus for it), and counted in `calcx/train/tool_parse_failures`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from calcx.agent.answer import ANSWER_RE
from calcx.api.models import RecordedCall
from calcx.contract.labels import CORRECT_ABOVE
from calcx.trainer.rollouts.rollout_samples import RolloutSamples
from calcx.trainer.rollouts.tool_use import TOOL_CALL_TAG, ToolUse, message_of, text_of

# what earns the tool bonus (`calcx.reward.tool_bonus_for`); the first is the default
TOOL_BONUS_FOR = ("call", "steps")
OPTIONS = ("tool_bonus", "tool_bonus_for", "mask_void_turns")


class RewardOptionError(ValueError):
    """A `calcx.reward` value out of its range; the message names the key."""


@dataclass(frozen=True)
class RewardOptions:
    tool_bonus: float = 0.0
    mask_void_turns: bool = False
    tool_bonus_for: str = TOOL_BONUS_FOR[0]

    @classmethod
    def from_config(cls, section: Mapping[str, Any] | None) -> RewardOptions:
        """From the composed `calcx.reward` section (None or missing keys: today's recipe)."""
        section = section or {}
        unknown = sorted(set(section) - set(OPTIONS))
        if unknown:
            raise RewardOptionError(f"calcx.reward has no option {', '.join(unknown)}; known: {', '.join(OPTIONS)}")
        bonus = section.get("tool_bonus", 0.0)
        if (
            isinstance(bonus, bool)
            or not isinstance(bonus, int | float)
            or not math.isfinite(bonus)
            or not 0.0 <= bonus < 1.0
        ):
            raise RewardOptionError(
                f"calcx.reward.tool_bonus must be a number in [0, 1) (0 = off), not {bonus!r}: "
                "below 1, a right answer without the tool still beats a wrong one with it"
            )
        mask = section.get("mask_void_turns", False)
        if not isinstance(mask, bool):
            raise RewardOptionError(f"calcx.reward.mask_void_turns must be true or false, not {mask!r}")
        bonus_for = section.get("tool_bonus_for", TOOL_BONUS_FOR[0])
        if not isinstance(bonus_for, str) or bonus_for not in TOOL_BONUS_FOR:
            raise RewardOptionError(
                f"calcx.reward.tool_bonus_for must be one of {', '.join(TOOL_BONUS_FOR)}, not {bonus_for!r}"
            )
        return cls(tool_bonus=float(bonus), mask_void_turns=mask, tool_bonus_for=bonus_for)

    @property
    def active(self) -> bool:
        return self.tool_bonus > 0 or self.mask_void_turns


def shaped_reward(answer_reward: float, use: ToolUse, options: RewardOptions) -> float:
    """The training reward of a rollout: the answer's, plus the tool bonus for a right answer
    reached with a successful calculator call (`steps`: scaled by the share of the row's reference
    steps those calls computed, where the row has any)."""
    if not (options.tool_bonus > 0 and answer_reward > CORRECT_ABOVE and use.used_calculator):
        return answer_reward
    share = use.steps_share if options.tool_bonus_for == "steps" else None
    return answer_reward + options.tool_bonus * (1.0 if share is None else share)


def is_void_turn(response: Mapping[str, Any] | None) -> bool:
    """A model turn that neither called a tool (a parsed call or a `<tool_call>` left in the text)
    nor gave the `### ANSWER` marker."""
    message = message_of(response)
    text = text_of(message.get("content"))
    return not message.get("tool_calls") and TOOL_CALL_TAG not in text and ANSWER_RE.search(text) is None


def apply_reward_options(
    samples: RolloutSamples, calls: Sequence[RecordedCall], use: ToolUse, options: RewardOptions
) -> RolloutSamples:
    """The rollout's samples with the options applied (the input is not changed). `calls` are the
    recorded calls the samples were made from (matched by call id)."""
    if not options.active:
        return samples
    reward = shaped_reward(samples.reward, use, options)
    responses = {str(c.call_id): c.response for c in calls}
    void = [options.mask_void_turns and is_void_turn(responses.get(s.call_id)) for s in samples.samples]
    all_void = bool(void) and all(void)
    if all_void:
        void = [False] * len(void)  # nothing would be left to train: the rollout is a wrong answer
    out = [
        replace(
            sample, reward=reward, response_mask=[0] * len(sample.response_mask) if masked else sample.response_mask
        )
        for sample, masked in zip(samples.samples, void)
    ]
    counters = dict(samples.counters)
    counters["void_turns_masked"] = sum(void)
    counters["void_rollouts_kept"] = int(all_void)
    return replace(samples, reward=reward, samples=out, counters=counters)
