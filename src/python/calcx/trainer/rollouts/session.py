"""One verl session of a GRPO group, end to end, without verl: spec -> settle -> calls -> samples.

`CalcxAgentLoop.run` is a thin wrapper around `run_session` (it only turns the samples into verl's
AgentLoopOutput), so the CPU tests and `calcx train --eval-only` drive exactly the code path that
training uses.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from calcx.api.client import AsyncCalcxClient
from calcx.trainer.rollouts.call_join import join_continued_calls
from calcx.trainer.rollouts.group import GroupSpec, settle_group
from calcx.trainer.rollouts.reward_options import RewardOptions, apply_reward_options
from calcx.trainer.rollouts.rollout_samples import RolloutIncomplete, RolloutSamples
from calcx.trainer.rollouts.tool_use import RolloutShape, attempt_calls, record_tool_use, rollout_tool_use
from calcx.trainer.rollouts.translate import translate_rollout
from calcx.trainer.run_dir.names import INCOMPLETE_GROUPS_FILE, SESSION_TIMES_FILE
from calcx.trainer.run_dir.server_key import server_key

logger = logging.getLogger(__name__)
CALCX_ROW_COLUMN = "calcx_row"
#: one line a session: when verl started it and when it returned (wall clock, as the server's own
#: clocks), so the step table can tell the sessions' own time from verl's around them


def row_from_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The Calc-X dataset row that `calcx.trainer.run.data` stored beside verl's columns."""
    raw = kwargs.get(CALCX_ROW_COLUMN)
    if isinstance(raw, str):
        return json.loads(raw)
    if isinstance(raw, Mapping):
        return dict(raw)
    raise ValueError(
        f"dataset row has no '{CALCX_ROW_COLUMN}' column; build the training files with "
        "calcx.trainer.run.data.to_verl_parquet (calcx train does this for you)"
    )


def is_validation(sampling_params: Mapping[str, Any], rollout_cfg: Any, kwargs: Mapping[str, Any]) -> bool:
    """verl 0.9.1 pops `validate` before calling run(); its validation sampling temperature tells."""
    if "validate" in kwargs:
        return bool(kwargs["validate"])
    temperature = float(sampling_params.get("temperature", rollout_cfg.temperature))
    return temperature == float(rollout_cfg.val_kwargs.temperature) and float(rollout_cfg.temperature) != float(
        rollout_cfg.val_kwargs.temperature
    )


def rollout_sampling(rollout_cfg: Any, *, validate: bool) -> dict[str, float | int]:
    """The sampling parameters the gateway applies to every model call of the rollout, the ones
    verl's own agent loops sample with: `rollout.{temperature, top_p, top_k}` for training,
    `rollout.val_kwargs`' for validation. `val_kwargs.do_sample: false` (verl's default) means
    greedy, as verl's config describes it: temperature 0, top_p 1, top_k off (verl's own greedy
    values). (verl 0.9.1's vLLM agent loops do not read do_sample; with its default temperature 0
    both agree.)"""
    source = rollout_cfg.val_kwargs if validate else rollout_cfg
    if validate and not bool(source.get("do_sample", True)):
        return {"temperature": 0.0, "top_p": 1.0, "top_k": 0}
    top_k = int(source.top_k)
    # verl writes "off" as -1; vLLM documents 0 as off (and accepts -1 only quietly). Leaving
    # top_k out would not mean off: vLLM would fill it from the served model's generation config.
    return {
        "temperature": float(source.temperature),
        "top_p": float(source.top_p),
        "top_k": 0 if top_k in (-1, 0) else top_k,
    }


def session_spec(
    calcx_cfg: Any, rollout_cfg: Any, sampling_params: Mapping[str, Any], kwargs: Mapping[str, Any]
) -> GroupSpec:
    """The group this verl session belongs to, from the `calcx:` and rollout config sections."""
    validate = is_validation(sampling_params, rollout_cfg, kwargs)
    env_map = calcx_cfg.get("env_map")
    return GroupSpec(
        uid=str(kwargs["uid"]),
        session_id=int(kwargs.get("session_id", 0)),
        n=int(rollout_cfg.val_kwargs.n if validate else rollout_cfg.n),
        step=int(kwargs.get("global_steps", 0) or 0),
        partition="val" if validate else "train",
        row=row_from_kwargs(kwargs),
        env_map=dict(env_map) if env_map is not None else None,
        deadline_s=float(calcx_cfg.deadline_s),
        max_attempts=int(calcx_cfg.max_attempts),
        wait_timeout_s=float(calcx_cfg.wait_timeout_s),
        group_timeout_s=float(calcx_cfg.group_timeout_s),
        sampling=rollout_sampling(rollout_cfg, validate=validate),
        run=str(calcx_cfg.get("run") or "") or None,
    )


def record_incomplete(report_dir: str | os.PathLike[str], exc: RolloutIncomplete, *, uid: str, step: int) -> None:
    """Append one line per incomplete session to `incomplete_groups.jsonl` (counted in the report)."""
    path = Path(report_dir) / INCOMPLETE_GROUPS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(
        {
            "time": time.time(),
            "step": step,
            "uid": uid,
            "rollout_id": exc.rollout_id,
            "reason": exc.reason,
            "detail": exc.detail,
        }
    )
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def record_session_time(
    report_dir: str | os.PathLike[str], spec: GroupSpec, *, entered: float, returned: float, ok: bool
) -> None:
    """Append the session's start and return (`ok`: it returned samples; False: it raised)."""
    path = Path(report_dir) / SESSION_TIMES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(
        {
            "step": spec.step,
            "partition": spec.partition,
            "rollout_id": spec.own_rollout_id(),
            "entered": entered,
            "returned": returned,
            "ok": ok,
        }
    )
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


async def run_session(
    spec: GroupSpec,
    *,
    server_url: str,
    key: str,
    report_dir: str | os.PathLike[str],
    max_prompt_length: int,
    max_response_length: int,
    join_calls: bool,
    reward_options: RewardOptions | None = None,
) -> RolloutSamples:
    """Create the group, settle it, translate this session's rollout; `RolloutIncomplete` leaves it out.

    The rollout's calculator use (from its recorded calls) goes to `{report_dir}/tool_use.jsonl`;
    `reward_options` (`calcx.reward`) shape a training rollout's samples, never a validation one's;
    `join_calls` (`calcx.join_calls`) makes calls that continue each other one sample."""
    client = AsyncCalcxClient(server_url, key)
    try:
        own = await settle_group(client, spec)
        calls = await client.calls(own.rollout_id)
        samples = translate_rollout(
            own,
            calls,
            max_prompt_length=max_prompt_length,
            max_response_length=max_response_length,
            expected_group_id=spec.uid,
        )
        used = attempt_calls(calls, samples.attempt_id)
        chain = spec.row.get("chain")
        use = rollout_tool_use(used, str(chain) if chain is not None else None)
        model_calls = len(samples.samples)
        if spec.partition == "train" and reward_options is not None:
            samples = apply_reward_options(samples, used, use, reward_options)
        if join_calls:  # after the reward options, which mask void turns call by call
            samples = join_continued_calls(samples, max_response_length=max_response_length)
        record_tool_use(
            report_dir,
            partition=spec.partition,
            step=spec.step,
            rollout_id=samples.rollout_id,
            use=use,
            shape=RolloutShape(model_calls=model_calls, sequences=len(samples.samples)),
            group=spec.uid,
            reward=samples.reward,
        )
        return samples
    except RolloutIncomplete as exc:
        record_incomplete(report_dir, exc, uid=spec.uid, step=spec.step)
        logger.warning("calcx: leaving group %s out of step %d: %s", spec.uid, spec.step, exc)
        raise
    finally:
        await client.aclose()


async def run_session_from_config(
    config: Any, sampling_params: Mapping[str, Any], kwargs: Mapping[str, Any]
) -> RolloutSamples:
    """`run_session` with everything taken from the composed trainer config (what the AgentLoop does)."""
    calcx, rollout = config.calcx, config.actor_rollout_ref.rollout
    spec = session_spec(calcx, rollout, sampling_params, kwargs)
    reward = calcx.get("reward")
    options = RewardOptions.from_config(dict(reward) if reward is not None else None)
    entered, ok = time.time(), False
    try:
        samples = await run_session(
            spec,
            server_url=str(calcx.server_url),
            key=server_key(calcx),
            report_dir=str(calcx.report_dir),
            max_prompt_length=int(rollout.prompt_length),
            max_response_length=int(rollout.response_length),
            reward_options=options,
            join_calls=bool(calcx.join_calls),
        )
        ok = True
        return samples
    finally:
        record_session_time(str(calcx.report_dir), spec, entered=entered, returned=time.time(), ok=ok)
