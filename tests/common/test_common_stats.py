"""The standard error every accuracy and accuracy change is given with (calcx.common.stats)."""

from __future__ import annotations

import math

import pytest

from calcx.common.stats import mean_and_standard_error


def test_an_accuracy_gets_the_binomial_standard_error() -> None:
    mean, se = mean_and_standard_error([1.0] * 135 + [0.0] * 65)  # 0.675 of 200, as a GPU run's validation
    assert mean == pytest.approx(0.675)
    assert se == pytest.approx(math.sqrt(0.675 * 0.325 / 200))
    assert round(se, 3) == 0.033


def test_a_change_on_the_same_problems_gets_the_paired_standard_error() -> None:
    # 19 problems gained, 23 lost, 158 unchanged: the change is -4/200 and its spread is that of the
    # per-problem differences, not of two independent accuracies
    mean, se = mean_and_standard_error([1.0] * 19 + [-1.0] * 23 + [0.0] * 158)
    assert mean == pytest.approx(-0.02)
    assert se == pytest.approx(math.sqrt((42 / 200 - 0.02**2) / 200))
    assert mean_and_standard_error([0.5, 0.5]) == (0.5, 0.0)


def test_no_values_is_an_error_not_a_zero() -> None:
    with pytest.raises(ValueError, match="at least one"):
        mean_and_standard_error([])
