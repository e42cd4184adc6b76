"""One percentile for every figure calcx prints (rehearsal summary, benchmarks), and the length of
a union of time intervals (how long at least one model call was in flight)."""

from __future__ import annotations

import math
from typing import Iterable, TypeVar

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
