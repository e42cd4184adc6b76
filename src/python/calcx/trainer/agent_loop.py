"""The verl 0.9.1 AgentLoop that feeds training from the calcx server instead of generating itself.

verl's V1 trainer (`trainer.use_v1=true`, TransferQueue) calls `run()` once per (prompt, session);
`run()` may return a list of AgentLoopOutput, one per model call, each stored as its own row
keyed `{uid}_{session}_{i}`. A session that raises marks its prompt's group as failed, and the
replay buffer then evicts the group (async always; sync with
`trainer.v1.sampler.sync_refill_failed_groups=true`) and counts it in
`train/rollout_failure/evicted_samples`: an incomplete group is never trained as reward 0.

Imports verl (and so torch and ray): load it only where verl is installed.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Mapping

from verl.experimental.agent_loop.agent_loop import (  # noqa: F401  (register is the public hook)
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from calcx.trainer.group import GroupSpec, settle_group
from calcx.trainer.server_api import TrainerServerClient
from calcx.trainer.translate import RolloutIncomplete, RolloutSamples, translate_rollout

logger = logging.getLogger(__name__)
CALCX_ROW_COLUMN = "calcx_row"


def to_agent_loop_outputs(samples: RolloutSamples, *, step: int) -> list[AgentLoopOutput]:
    """One AgentLoopOutput per recorded call; the rollout's reward on each (verl sets it on the last
    call's final token; GRPO groups all rows by uid)."""
    outputs = []
    low = samples.min_policy_version if samples.min_policy_version is not None else step
    high = samples.max_policy_version if samples.max_policy_version is not None else step
    for turn, sample in enumerate(samples.samples):
        outputs.append(
            AgentLoopOutput(
                prompt_ids=sample.prompt_ids,
                response_ids=sample.response_ids,
                response_mask=sample.response_mask,
                response_logprobs=sample.response_logprobs,
                reward_score=sample.reward,
                num_turns=2 * (turn + 1),
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


def row_from_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The Calc-X dataset row that `calcx.trainer.data` stored beside verl's columns."""
    raw = kwargs.get(CALCX_ROW_COLUMN)
    if isinstance(raw, str):
        return json.loads(raw)
    if isinstance(raw, Mapping):
        return dict(raw)
    raise ValueError(
        f"dataset row has no '{CALCX_ROW_COLUMN}' column; build the training files with "
        "calcx.trainer.data.to_verl_parquet (calcx train does this for you)"
    )


def record_incomplete(report_dir: str | os.PathLike[str], exc: RolloutIncomplete, *, uid: str, step: int) -> None:
    """Append one line per incomplete session to `incomplete_groups.jsonl` (counted in the report)."""
    path = Path(report_dir) / "incomplete_groups.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"time": time.time(), "step": step, "uid": uid, "rollout_id": exc.rollout_id,
                       "reason": exc.reason, "detail": exc.detail})
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


class CalcxAgentLoop(AgentLoopBase):
    """Create the rollout on the calcx server, wait for its group, return its recorded calls."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        calcx = self.config.calcx
        rollout = self.rollout_config
        uid = str(kwargs["uid"])
        step = int(kwargs.get("global_steps", 0) or 0)
        validate = bool(kwargs.get("validate", False)) or (
            float(sampling_params.get("temperature", rollout.temperature)) == float(rollout.val_kwargs.temperature)
            and float(rollout.temperature) != float(rollout.val_kwargs.temperature)
        )
        spec = GroupSpec(
            uid=uid,
            session_id=int(kwargs.get("session_id", 0)),
            n=int(rollout.val_kwargs.n if validate else rollout.n),
            step=step,
            partition="val" if validate else "train",
            row=row_from_kwargs(kwargs),
            env_map=dict(calcx.env_map) if calcx.get("env_map") is not None else None,
            deadline_s=float(calcx.deadline_s),
            max_attempts=int(calcx.max_attempts),
            wait_timeout_s=float(calcx.wait_timeout_s),
            group_timeout_s=float(calcx.group_timeout_s),
        )
        client = TrainerServerClient(str(calcx.server_url), str(calcx.key or ""))
        try:
            own = await settle_group(client, spec)
            calls = await client.calls(own["rollout_id"])
            samples = translate_rollout(
                own, calls, max_prompt_length=int(rollout.prompt_length),
                max_response_length=int(rollout.response_length), expected_group_id=uid,
            )
        except RolloutIncomplete as exc:
            record_incomplete(str(calcx.report_dir), exc, uid=uid, step=step)
            logger.warning("calcx: leaving group %s out of step %d: %s", uid, step, exc)
            raise
        finally:
            await client.aclose()
        return to_agent_loop_outputs(samples, step=step)
