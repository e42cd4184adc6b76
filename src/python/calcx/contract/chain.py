"""GSM8K's calculator annotations in a Calc-X row's `chain`, read where they are needed: the data
commands' traces and hard split (calcx.data) and the trainer's count of the reference steps a
rollout's calculator computed (calcx.trainer.rollouts.tool_use), one parser for both.

GSM8K marks each computation of its reference solution as `48/2 = <<48/2=24>>24`: an expression
and its result. Standard library only, like the rest of the contract.
"""

from __future__ import annotations

import math
import re

ANNOTATION_RE = re.compile(r"<<([^<>]*)>>")
# two numbers closer than this, relative to the larger, are one result (`1,200` and `1200.0`)
SAME_NUMBER_REL_TOL = 1e-9


def annotation_marks(chain: str) -> list[tuple[str, str] | None]:
    """(expression, result) of every `<<expression=result>>` in order, both stripped; None for a
    mark that is not `expression=result` (no `=`, or a side empty)."""
    marks: list[tuple[str, str] | None] = []
    for mark in ANNOTATION_RE.findall(chain):
        expression, sep, result = mark.rpartition("=")
        marks.append((expression.strip(), result.strip()) if sep and expression.strip() and result.strip() else None)
    return marks


def parse_number(text: str) -> float | None:
    """A result's text as a finite number (`1,200`, `24.`, `1200.0`), or None."""
    try:
        value = float(text.strip().replace(",", "").rstrip("."))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def same_number(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=SAME_NUMBER_REL_TOL, abs_tol=0.0)


def reference_results(chain: str | None) -> list[float]:
    """The distinct numeric results of the chain's annotations, in order of first appearance (a
    result that is no number, or a broken mark, is left out; no chain: none)."""
    distinct: list[float] = []
    for mark in annotation_marks(chain or ""):
        value = parse_number(mark[1]) if mark is not None else None
        if value is not None and not any(same_number(value, seen) for seen in distinct):
            distinct.append(value)
    return distinct
