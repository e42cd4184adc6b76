"""The verl 0.9.1 AgentLoop that feeds training from the calcx server instead of generating itself.

verl's V1 trainer (`trainer.use_v1=true`, TransferQueue) calls `run()` once per (prompt, session);
`run()` may return a list of AgentLoopOutput, one per sample (a model call, or calls joined into
one sequence), each stored as its own row keyed `{uid}_{session}_{i}`. A session that raises marks its prompt's group as failed, and the
replay buffer then evicts the group (async always; sync with
`trainer.v1.sampler.sync_refill_failed_groups=true`) and counts it in
`training/rollout_failure/evicted_samples`: an incomplete group is never trained as reward 0.

Registered under verl's own hook, `@register(CALCX_AGENT_LOOP)`, as verl's loops are
(tool_agent_loop.py). A decorator only runs where its module is imported, and verl's
AgentLoopWorker (a Ray actor in its own process) imports only verl's own loops
(`verl.experimental.agent_loop`) and the classes named in `agent.agent_loop_config_path`: so that
config names this class in the packaged agent_loops.yaml, and instantiating it imports this module
in the worker. The name itself is `calcx.trainer.config.compose.CALCX_AGENT_LOOP`, which composition also
makes verl's `default_agent_loop` (config.py cannot import this module: it imports verl).

Imports verl (and so torch and ray): load it only where verl is installed.
"""

from __future__ import annotations

import logging
from typing import Any

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from calcx.trainer.config.compose import CALCX_AGENT_LOOP
from calcx.trainer.rollouts.rollout_samples import RolloutSamples
from calcx.trainer.rollouts.session import run_session_from_config

logger = logging.getLogger(__name__)


def to_agent_loop_outputs(samples: RolloutSamples, *, step: int) -> list[AgentLoopOutput]:
    """One AgentLoopOutput per sample (a recorded call, or calls joined into one sequence by
    calcx.trainer.rollouts.call_join); the rollout's reward on each (verl sets it on the last token; GRPO
    groups all rows by uid).

    `min/max_global_steps` are the oldest and newest policy versions that served the calls (the
    server records the version it was told after each weight sync), which verl turns into
    trajectory staleness. Calls recorded without a version count as served by the weights of the
    step before `step`, the version an on-policy sample has."""
    outputs = []
    on_policy = max(step - 1, 0)
    low = samples.min_policy_version if samples.min_policy_version is not None else on_policy
    high = samples.max_policy_version if samples.max_policy_version is not None else on_policy
    calls = 0
    for sample in samples.samples:
        calls += sample.calls
        outputs.append(
            AgentLoopOutput(
                prompt_ids=sample.prompt_ids,
                response_ids=sample.response_ids,
                response_mask=sample.response_mask,
                response_logprobs=sample.response_logprobs,
                reward_score=sample.reward,
                num_turns=2 * calls,
                metrics=AgentLoopMetrics(generate_sequences=sample.latency_s),
                extra_fields={
                    "reward_extra_info": {},
                    "min_global_steps": low,
                    "max_global_steps": high,
                    "calcx_rollout_id": samples.rollout_id,
                    "calcx_call_id": sample.call_id,
                },
            )
        )
    return outputs


@register(CALCX_AGENT_LOOP)
class CalcxAgentLoop(AgentLoopBase):
    """Create the rollout on the calcx server, wait for its group, return its recorded calls.

    The work is `calcx.trainer.rollouts.session.run_session_from_config` (verl-free, tested on CPU against
    the real server); this class only adapts its samples to verl's AgentLoopOutput."""

    # verl 0.9.1's V1 worker (AgentLoopWorkerTQ) takes a list, one output per sample
    # (docs/trainer.md); the base class still names the legacy worker's single output.
    async def run(  # type: ignore[override]
        self, sampling_params: dict[str, Any], **kwargs: Any
    ) -> list[AgentLoopOutput]:
        step = int(kwargs.get("global_steps", 0) or 0)
        samples = await run_session_from_config(self.config, sampling_params, kwargs)
        return to_agent_loop_outputs(samples, step=step)
