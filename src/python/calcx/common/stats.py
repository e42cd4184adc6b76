"""One percentile for every figure calcx prints (rehearsal summary, benchmarks), the length of
a union of time intervals (how long at least one model call was in flight), and the standard error
that every accuracy and accuracy change is given with."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")


def percentile(values: Iterable[float], q: float, default: T = None) -> float | T:  # type: ignore[assignment]
    """The nearest-rank percentile: the smallest value with at least a fraction `q` of the values
    at or below it (`default` when there are none). Always one of the values, never interpolated."""
    ordered = sorted(values)
    if not ordered:
        return default
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def union_length(spans: Iterable[tuple[float, float]]) -> float:
    """Length of the union of [start, stop] intervals."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def mean_and_standard_error(values: Iterable[float]) -> tuple[float, float]:
    """The mean and its standard error, sqrt(population variance / n): for 0/1 outcomes that is the
    binomial sqrt(p (1 - p) / n) of an accuracy; for per-problem differences of two evaluations on
    the same problems, the paired standard error of the change."""
    items = list(values)
    if not items:
        raise ValueError("no values: a mean needs at least one")
    n = len(items)
    mean = math.fsum(items) / n
    return mean, math.sqrt(math.fsum((x - mean) ** 2 for x in items) / n / n)
