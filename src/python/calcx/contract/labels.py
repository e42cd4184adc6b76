"""The labels a trainer rollout carries, which the server, the trainer and the GPU run's tables read.

`RUN_LABEL` names the training run (`calcx train` sets it to `trainer.experiment_name`; the cancel
API and the training ledger find a run's rollouts by it); `PARTITION_LABEL` (`train` or `val`) and
`STEP_LABEL` (the training step, as decimal text) say what the rollout was made for.
"""

from __future__ import annotations

import math
from typing import Mapping

RUN_LABEL = "run"
PARTITION_LABEL = "partition"
STEP_LABEL = "step"


def origin_of(labels: Mapping[str, str]) -> tuple[str, int] | None:
    """(partition, step) a rollout's labels name; None for one the trainer did not make (no
    partition, or a step that is not ASCII decimal digits)."""
    partition = labels.get(PARTITION_LABEL)
    step = str(labels.get(STEP_LABEL, ""))
    if partition is None or not (step.isascii() and step.isdigit()):
        return None
    return partition, int(step)


def scored_reward(state: str, reward: float | None) -> float | None:
    """The reward a rollout scored, or None where it has none to count: one that did not succeed
    is an infrastructure failure, never a wrong answer, and so is one without a finite reward."""
    if state != "SUCCEEDED" or reward is None or not math.isfinite(reward):
        return None
    return float(reward)
