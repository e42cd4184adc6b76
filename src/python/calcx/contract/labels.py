"""The labels a trainer rollout carries, which the server, the trainer and the GPU run's tables read.

`RUN_LABEL` names the training run (`calcx train` sets it to `trainer.experiment_name`; the cancel
API and the training ledger find a run's rollouts by it); `PARTITION_LABEL` (`train` or `val`) and
`STEP_LABEL` (the training step, as decimal text) say what the rollout was made for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

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


def finite_reward(value: object) -> float | None:
    """`value` as a reward: a finite number (a bool is not one), else None. Readers of stored or
    sent records (JSON, SQLite) see any type there."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past float's range
        return None
    return number if math.isfinite(number) else None


# an answer counts as right above this reward (the agent posts 1.0 or 0.0; a tool bonus adds to a right one)
CORRECT_ABOVE = 0.5


def scored_reward(state: str, reward: object) -> float | None:
    """The reward a rollout scored, or None where it has none to count: one that did not succeed
    is an infrastructure failure, never a wrong answer, and so is one without a finite reward."""
    return finite_reward(reward) if state == "SUCCEEDED" else None
