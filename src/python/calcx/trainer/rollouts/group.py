"""Settle a GRPO group on the calcx server: create, wait (long poll), retry infrastructure failures.

Every session of a group runs the same procedure and so reaches the same verdict without talking
to its siblings: it creates all n rollouts of the group (creation is idempotent on rollout_id),
then settles each one. A FAILED rollout with attempts left is retried as a new attempt (a 409
means a sibling already did it); a FAILED rollout out of attempts or cancelled through the cancel
API, or a group that does not settle in time, makes the whole group incomplete, and every session
raises `RolloutIncomplete`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from calcx.api.client import AsyncCalcxClient, CalcxAPIError
from calcx.api.models import Rollout
from calcx.contract.failures import FailureReason
from calcx.contract.labels import PARTITION_LABEL, RUN_LABEL, STEP_LABEL, origin_of, scored_reward
from calcx.trainer.rollouts.rollout_request import rollout_create_body, rollout_id_for
from calcx.trainer.rollouts.rollout_samples import RolloutIncomplete

#: a rollout the cancel API ended is withdrawn work: the server refuses its retry, and so the
#: group is incomplete. An attempt a stopping controller cancelled (`cancelled`) is retried.
CANCELLED_BY_API = FailureReason.CANCELLED_BY_API


@dataclass(frozen=True)
class RolloutOrigin:
    """The partition (`train`, `val`) and training step a trainer rollout was made for."""

    partition: str
    step: int

    def labels(self, run: str | None) -> dict[str, str]:
        """What the rollout is created with (`run`: the training run's name, RUN_LABEL)."""
        labels = {PARTITION_LABEL: self.partition, STEP_LABEL: str(self.step)}
        if run:
            labels[RUN_LABEL] = run
        return labels

    @classmethod
    def of(cls, rollout: Rollout) -> RolloutOrigin | None:
        """The origin its labels name; None for a rollout the trainer did not make."""
        origin = origin_of(rollout.labels)
        return None if origin is None else cls(*origin)


@dataclass
class GroupSpec:
    """Which group this session belongs to and how its rollouts are made."""

    uid: str
    session_id: int
    n: int
    step: int
    partition: str
    row: Mapping[str, Any]
    env_map: Mapping[str, str] | None
    deadline_s: float
    max_attempts: int
    wait_timeout_s: float
    group_timeout_s: float
    sampling: Mapping[str, float | int] | None = None  # applied by the gateway to every model call
    run: str | None = None  # the training run's name: every rollout's RUN_LABEL (what the cancel API finds)

    @property
    def origin(self) -> RolloutOrigin:
        return RolloutOrigin(self.partition, self.step)

    def rollout_ids(self) -> list[str]:
        return [rollout_id_for(self.partition, self.step, self.uid, j) for j in range(self.n)]

    def own_rollout_id(self) -> str:
        return rollout_id_for(self.partition, self.step, self.uid, self.session_id)

    def bodies(self) -> list[dict[str, Any]]:
        """Every member's `RolloutCreate`; the group is `group_id` (verl's uid), not a label."""
        labels = self.origin.labels(self.run)
        return [
            rollout_create_body(
                rollout_id=rid,
                group_id=self.uid,
                row=self.row,
                policy_version=self.step,
                env_map=self.env_map,
                deadline_s=self.deadline_s,
                max_attempts=self.max_attempts,
                labels=labels,
                sampling=self.sampling,
            )
            for rid in self.rollout_ids()
        ]


async def settle_rollout(
    client: AsyncCalcxClient, rollout_id: str, *, wait_timeout_s: float, deadline: float
) -> Rollout:
    """Wait until the rollout is SUCCEEDED or FAILED with no attempt left; retry FAILED ones."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RolloutIncomplete(rollout_id, "group_timeout", "the group did not settle in time")
        rollout = await client.wait(rollout_id, timeout_s=max(1.0, min(wait_timeout_s, remaining)))
        if rollout.state == "SUCCEEDED":
            return rollout
        if rollout.state == "FAILED":
            if len(rollout.attempts) >= rollout.max_attempts or rollout.latest_attempt.reason == CANCELLED_BY_API:
                return rollout  # out of attempts, or withdrawn (the cancel API: another start of the run)
            try:
                await client.retry(rollout_id)
            except CalcxAPIError as exc:
                if exc.status != 409:  # 409: a sibling session retried it first
                    raise


async def settle_group(client: AsyncCalcxClient, spec: GroupSpec) -> Rollout:
    """Settle the whole group; return this session's own SUCCEEDED rollout or raise RolloutIncomplete."""
    await client.create_rollouts(spec.bodies())
    deadline = time.monotonic() + spec.group_timeout_s
    own_id = spec.own_rollout_id()
    order = [own_id] + [rid for rid in spec.rollout_ids() if rid != own_id]
    settled: dict[str, Rollout] = {}
    for rid in order:
        rollout = await settle_rollout(client, rid, wait_timeout_s=spec.wait_timeout_s, deadline=deadline)
        if scored_reward(rollout.state, rollout.reward) is None:
            attempts = rollout.attempts
            reason = attempts[-1].reason if attempts else None
            raise RolloutIncomplete(
                own_id,
                "group_incomplete",
                (
                    f"member {rid} ended {rollout.state} after {len(attempts)} attempt(s), last reason {reason}"
                    if rollout.state != "SUCCEEDED"
                    else f"member {rid} SUCCEEDED without a reward"
                ),
            )
        settled[rid] = rollout
    return settled[own_id]
