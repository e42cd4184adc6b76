"""Calc-X reward: does the model's answer match the dataset's result?

Semantics (Calc-X ``scalar_are_results_same``, relative tolerance 1e-2 unless the row sets its own,
as the hard-arithmetic split does: RESULT_REL_TOL):
exact match after stripping; multiple-choice letters normalised (``C``, ``(c)``,
``C)``); otherwise both sides read as numbers and compared with ``math.isclose``.
Numbers may be fractions (``2/3``), have thousands separators (``1,000``,
``1_000``), a percent sign, a currency sign, simple LaTeX (``\\frac{1}{4}``,
``\\boxed{x}``) or Calc-X's `` = around X`` suffix: ``A = around B`` is one number only when
its two sides agree, so ``3 = around 5`` matches neither 3 nor 5. Nothing from the model's text
is ever executed: numbers go through :mod:`calcx.agent.numeric`, whose input,
exponents and magnitudes are bounded, so hostile answers return ``False`` fast.
"""

from __future__ import annotations

import math
import re

from calcx.agent.numeric import MAX_EXPRESSION_CHARS, try_evaluate
from calcx.contract.env import CALC_X_REL_TOL

# Longer answers are not numbers or letters; they are compared only for exact equality.
MAX_COMPARED_CHARS = 4 * MAX_EXPRESSION_CHARS

_CHOICE_RE = re.compile(r"^(?:option|answer|choice)?\s*[:\s]?\s*\(?\s*([A-Ea-e])\s*[).:]?$", re.IGNORECASE)
_TRUE_CHOICE_RE = re.compile(r"^\(?\s*([A-Ea-e])\s*[).:]?$")
_FRAC_RE = re.compile(r"\\d?frac\s*\{([^{}]{1,64})\}\s*\{([^{}]{1,64})\}")
_BOXED_RE = re.compile(r"^\\boxed\s*\{(.{1,512})\}$")
_AROUND_RE = re.compile(r"\s*=\s*around\s+", re.IGNORECASE)


def choice_letter(text: str, *, strict: bool = False) -> str | None:
    """The upper-case multiple-choice letter ``text`` names, or None."""
    text = text.strip()
    if len(text) > 32:
        return None
    match = (_TRUE_CHOICE_RE if strict else _CHOICE_RE).match(text)
    return match.group(1).upper() if match else None


def _clean_number_text(text: str) -> str:
    text = text.strip()
    boxed = _BOXED_RE.match(text)
    if boxed:
        text = boxed.group(1).strip()
    text = text.replace("$", "").replace("€", "").replace("£", "")
    text = _FRAC_RE.sub(lambda m: f"({m.group(1)})/({m.group(2)})", text)
    text = text.replace("\\cdot", "*").replace("\\times", "*").replace("\\div", "/")
    text = text.replace("\\left", "").replace("\\right", "").replace("\\%", "%")
    return text.strip().rstrip(".").strip()


def _part_values(part: str) -> list[float]:
    """The values one side of an answer could mean: the number, and for ``x%`` also ``x``."""
    part = part.strip()
    if not part:
        return []
    values: list[float] = []
    value = try_evaluate(part)
    if value is not None:
        values.append(value)
    if part.endswith("%"):
        whole = try_evaluate(part.rstrip("%"))
        if whole is not None:
            values.append(whole)
    return values


def _any_close(left: list[float], right: list[float], rel_tol: float) -> bool:
    return any(math.isclose(a, b, rel_tol=rel_tol) for a in left for b in right)


def number_candidates(text: str, rel_tol: float = CALC_X_REL_TOL) -> list[float]:
    """The values ``text`` could sensibly mean as a number (possibly none).

    ``A = around B`` (Calc-X's way of writing a rounded fraction) means A only when B agrees
    with it: a text whose two sides disagree is no number at all, so it can match neither.
    ``lhs = value`` means the value, the part after the last ``=``.
    """
    if len(text) > MAX_COMPARED_CHARS:
        return []
    text = _clean_number_text(text)
    around = _AROUND_RE.split(text)
    if len(around) == 2:
        left, right = _part_values(around[0]), _part_values(around[1])
        if left and right and not _any_close(left, right, rel_tol):
            return []
        return left or right
    if "=" in text:
        text = text.rsplit("=", 1)[1]
    return _part_values(text)


def scalar_are_results_same(pred: str, true: str, rel_tol: float = CALC_X_REL_TOL) -> bool:
    """True when the predicted answer ``pred`` matches the ground truth ``true``."""
    pred = "" if pred is None else str(pred)
    true = "" if true is None else str(true)
    pred_s, true_s = pred.strip(), true.strip()
    if pred_s == true_s:
        return True
    if not pred_s or not true_s:
        return False
    true_letter = choice_letter(true_s, strict=True)
    if true_letter is not None:
        return choice_letter(pred_s) == true_letter
    # `A = around B` is one number when its sides agree within Calc-X's tolerance, whatever the row's
    true_values = number_candidates(true_s)
    if not true_values:
        return False
    pred_values = number_candidates(pred_s)
    return any(math.isclose(p, t, rel_tol=rel_tol) for p in pred_values for t in true_values)


def reward(pred: str, true: str, rel_tol: float = CALC_X_REL_TOL) -> float:
    """1.0 when the answer matches the result within ``rel_tol``, else 0.0."""
    return 1.0 if scalar_are_results_same(pred, true, rel_tol) else 0.0
