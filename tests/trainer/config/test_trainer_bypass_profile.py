"""The candidate profile gsm8k-h200-bypass: verl's rollout-correction bypass (no old-log-prob pass)
on the default recipe, and the rollout log-probs it trains against."""

from __future__ import annotations

import pytest
import torch
from config_leaves import differing

from calcx.trainer.config.compose import ComposeRequest, compose
from calcx.trainer.rollouts.call_join import join_continued_calls
from calcx.trainer.rollouts.rollout_samples import CallSample, RolloutSamples
from calcx.trainer.workers.calcx_agent_loop import to_agent_loop_outputs

BYPASS = "gsm8k-h200-bypass"
# what verl's v1 trainer reads (algorithm.rollout_correction.bypass_mode: old log-probs := rollout
# log-probs) and its loss type, which is the actor's vanilla PPO clip
BYPASS_KEYS = {"algorithm.rollout_correction.bypass_mode": True, "algorithm.rollout_correction.loss_type": "ppo_clip"}


@pytest.mark.parametrize("memory", [79.6, 140.4])  # an 80 GB card (medium), an H200 (large)
def test_the_bypass_profile_is_the_default_with_bypass_alone(memory: float) -> None:
    from omegaconf import OmegaConf

    from calcx.trainer.run.launch import validate_with_verl

    bypass = compose(ComposeRequest(gpu_memory_gib=memory, run_profile=BYPASS))
    default = compose(ComposeRequest(gpu_memory_gib=memory, run_profile="gsm8k-h200"))
    for key, value in BYPASS_KEYS.items():
        assert OmegaConf.select(bypass, key) == value, key
    assert default.algorithm.rollout_correction.bypass_mode is False
    # loss_type's verl default is already ppo_clip: the profile states it, and only bypass_mode differs
    assert differing(bypass, default) == {"algorithm.rollout_correction.bypass_mode", "calcx.run_profile_applied"}
    assert bypass.actor_rollout_ref.rollout.calculate_log_probs is True  # vLLM returns the sampled log-probs
    assert bypass.algorithm.rollout_correction.rollout_is is None  # no IS weight on top of the clipped ratio
    validate_with_verl(bypass)


def _joined_rollout() -> RolloutSamples:
    """Two calls of one rollout, the second's prompt the first's prompt, answer and the tool's answer."""
    first = CallSample(
        call_id="c0",
        seq=0,
        prompt_ids=[1, 2, 3],
        response_ids=[10, 11],
        response_mask=[1, 1],
        response_logprobs=[-0.5, -0.25],
        reward=1.0,
        policy_version=0,
        latency_s=0.1,
    )
    second = CallSample(
        call_id="c1",
        seq=1,
        prompt_ids=[1, 2, 3, 10, 11, 20, 21],
        response_ids=[30, 31],
        response_mask=[1, 1],
        response_logprobs=[-1.0, -0.125],
        reward=1.0,
        policy_version=0,
        latency_s=0.1,
    )
    samples = RolloutSamples(rollout_id="r", group_id="g", attempt_id="1", reward=1.0, samples=[first, second])
    return join_continued_calls(samples, max_response_length=64)


def test_joined_calls_reach_verl_with_rollout_log_probs_and_the_tool_tokens_stay_out_of_the_ratio() -> None:
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.utils.config import omega_conf_to_dataclass

    [output] = to_agent_loop_outputs(_joined_rollout(), step=1)
    row = output.as_dict()
    rollout_lp, mask = row["rollout_log_probs"], row["response_mask"]  # the key verl's bypass reads
    assert mask.tolist() == [1, 1, 0, 0, 1, 1] and rollout_lp.tolist() == [-0.5, -0.25, 0.0, 0.0, -1.0, -0.125]
    actor = omega_conf_to_dataclass(
        compose(ComposeRequest(gpu_memory_gib=140.4, run_profile=BYPASS)).actor_rollout_ref.actor
    )
    loss_fn = get_policy_loss_fn(actor.policy_loss.loss_mode)  # the v1 trainer keeps the actor's loss
    advantages = torch.tensor([[1.0, -1.0, 1.0, 1.0, -1.0, 1.0]])

    def loss(current: list[float]) -> float:
        value, _ = loss_fn(
            old_log_prob=rollout_lp[None],
            log_prob=torch.tensor([current]),
            advantages=advantages,
            response_mask=mask[None],
            loss_agg_mode=actor.loss_agg_mode,
            config=actor,
        )
        return float(value)

    trained = [-0.4, -0.3, -2.0, -7.0, -0.9, -0.2]
    # whatever the policy now gives the tool's tokens, against their 0.0 placeholders, the loss is the same
    assert loss(trained) == pytest.approx(loss(trained[:2] + [-30.0, 5.0] + trained[4:]))
    # and a sampled token's ratio moves it
    assert loss(trained) != pytest.approx(loss([-3.0] + trained[1:]))
