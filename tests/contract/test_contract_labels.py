"""What a rollout's labels say it was made for, and what it scored: the one reading the server,
the trainer, its report and the GPU run's tables share."""

from __future__ import annotations

import math

import pytest

from calcx.contract.labels import PARTITION_LABEL, STEP_LABEL, finite_reward, origin_of, scored_reward


@pytest.mark.parametrize(
    "value, expected",
    [
        (1, 1.0),
        (0.0, 0.0),
        (-0.5, -0.5),
        (0.25, 0.25),
        (True, None),
        (False, None),  # a bool is a JSON true/false, never a score
        (None, None),
        ("1.0", None),
        ([1.0], None),
        (math.nan, None),
        (math.inf, None),
        (-math.inf, None),
        (10**400, None),
    ],
)
def test_finite_reward_takes_finite_numbers_only(value: object, expected: float | None) -> None:
    got = finite_reward(value)
    assert got == expected and (got is None or type(got) is float)


def test_only_a_succeeded_rollout_with_a_finite_reward_scored() -> None:
    assert scored_reward("SUCCEEDED", 1.0) == 1.0
    assert scored_reward("SUCCEEDED", 0) == 0.0  # a wrong answer scored zero: it counts
    assert scored_reward("SUCCEEDED", None) is None
    assert scored_reward("SUCCEEDED", math.nan) is None
    for state in ("FAILED", "RUNNING", "QUEUED"):  # an infrastructure failure is never a wrong answer
        assert scored_reward(state, 1.0) is None
        assert scored_reward(state, 0.0) is None


def test_origin_of_reads_partition_and_decimal_step() -> None:
    assert origin_of({PARTITION_LABEL: "train", STEP_LABEL: "12"}) == ("train", 12)
    assert origin_of({PARTITION_LABEL: "val", STEP_LABEL: "0"}) == ("val", 0)
    assert origin_of({STEP_LABEL: "3"}) is None  # not made by the trainer
    assert origin_of({PARTITION_LABEL: "train"}) is None
    for step in ("-1", "1.5", " 2", "", "\u0663"):  # ARABIC-INDIC DIGIT THREE is a digit, not ASCII
        assert origin_of({PARTITION_LABEL: "train", STEP_LABEL: step}) is None, step
