"""Validation results of a run, read back from the calcx server, and the `--eval-only` driver.

Every validation rollout the AgentLoop creates is labelled with its partition (`val`) and step
(`calcx.trainer.rollouts.group.RolloutOrigin`) and carries its Calc-X row, so the server alone can say, per
row, which source it came from and what reward it got. The table of a run is its last validation
step. A rollout that ended FAILED is an infrastructure failure, not a wrong answer: it is counted
apart, never scored 0.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from calcx.api.client import AsyncCalcxClient
from calcx.api.models import Rollout
from calcx.contract.labels import scored_reward
from calcx.trainer.rollouts.group import RolloutOrigin
from calcx.trainer.rollouts.rollout_samples import RolloutIncomplete
from calcx.trainer.rollouts.session import run_session_from_config


@dataclass
class EvalCollection:
    """Per-rollout results of one validation step."""

    step: int | None
    records: list[dict[str, Any]] = field(default_factory=list)
    unscored: list[dict[str, Any]] = field(default_factory=list)  # FAILED / no reward / still running

    def note(self) -> str:
        if self.step is None:
            return "No validation rollout was found on the calcx server."
        text = f"Validation step {self.step}: {len(self.records)} scored rollout(s)"
        if self.unscored:
            states: dict[str, int] = {}
            for item in self.unscored:
                states[item["state"]] = states.get(item["state"], 0) + 1
            shown = ", ".join(f"{k} {v}" for k, v in sorted(states.items()))
            text += f"; {len(self.unscored)} not scored ({shown}), left out of the table"
        return text + "."


def eval_collection(rollouts: Sequence[Rollout], *, step: int | None = None) -> EvalCollection:
    """The records of validation step `step` (default: the last one present) from the server's rollouts."""
    by_step: dict[int, list[Rollout]] = {}
    for rollout in rollouts:
        origin = RolloutOrigin.of(rollout)
        if origin is not None and origin.partition == "val":
            by_step.setdefault(origin.step, []).append(rollout)
    if not by_step:
        return EvalCollection(step=None)
    chosen = max(by_step) if step is None else step
    out = EvalCollection(step=chosen)
    for rollout in by_step.get(chosen, []):
        row = rollout.row
        reward = scored_reward(rollout.state, rollout.reward)
        base = {
            "rollout_id": rollout.rollout_id,
            "source": str(row.get("source") or "unknown"),
            "row_id": row.get("id"),
            "state": rollout.state,
        }
        if reward is not None:
            out.records.append({**base, "reward": reward})
        else:
            out.unscored.append(base)
    return out


async def collect_eval_async(server_url: str, key: str, *, step: int | None = None) -> EvalCollection:
    client = AsyncCalcxClient(server_url, key)
    try:
        return eval_collection(await client.all_rollouts(), step=step)
    finally:
        await client.aclose()


def collect_eval(server_url: str, key: str, *, step: int | None = None) -> EvalCollection:
    """Blocking form for the trainer's driver, after verl has returned."""
    return asyncio.run(collect_eval_async(server_url, key, step=step))


def val_session_kwargs(row: Mapping[str, Any], *, uid: str, session_id: int, step: int) -> dict[str, Any]:
    """What verl hands `CalcxAgentLoop.run` for one validation session (the columns `data.py` writes)."""
    return {
        "uid": uid,
        "session_id": session_id,
        "global_steps": step,
        "validate": True,
        "calcx_row": json.dumps(dict(row), ensure_ascii=False, sort_keys=True),
        "data_source": str(row.get("source") or "calcx"),
    }


async def run_validation(
    config: Any, rows: Sequence[Mapping[str, Any]], *, step: int = 0, groups_in_flight: int = 32
) -> dict[str, int]:
    """Every row as one validation group of `rollout.val_kwargs.n` sessions, through `run_session`
    (the AgentLoop's own path). Returns counts: sessions, succeeded, incomplete."""
    n = int(config.actor_rollout_ref.rollout.val_kwargs.n)
    gate = asyncio.Semaphore(max(1, groups_in_flight))
    counts = {"sessions": 0, "succeeded": 0, "incomplete": 0}

    async def one_group(row: Mapping[str, Any]) -> None:
        uid = str(uuid.uuid4())
        async with gate:
            results = await asyncio.gather(
                *[
                    run_session_from_config(config, {}, val_session_kwargs(row, uid=uid, session_id=i, step=step))
                    for i in range(n)
                ],
                return_exceptions=True,
            )
        for result in results:
            counts["sessions"] += 1
            if isinstance(result, RolloutIncomplete):
                counts["incomplete"] += 1
            elif isinstance(result, BaseException):
                raise result
            else:
                counts["succeeded"] += 1

    await asyncio.gather(*[one_group(row) for row in rows])
    return counts
