"""The hard-arithmetic split: GSM8K problems with their numbers made large, as GSM-Hard did.

GSM8K's arithmetic is easy enough to do in the head, so an agent trained on it alone learns to
drop its calculator. Here each problem keeps its story and its steps, but its numbers are large:

1. the question's whole numbers (`48`, `1,200`) are found; each one of at least 2 that is not a
   small count or common unit (`KEPT`: 2, 3, 4, 7, 10, 12, 24, 60, 100, ...), a year, a percentage nor
   an ordinal is multiplied by the problem's factor F, drawn from its id and the seed within the
   split's factor range (FACTOR_RANGE unless asked). Scaling them all by one factor keeps the
   question's ratios whole and its differences signed as they were, and makes every product a
   many-digit one;
2. the problem's own calculator annotations (`<<48/2=24>>`) are rewritten in order: a number that
   is an enlarged question number, or an earlier annotation's result, takes its new value;
3. each rewritten expression is evaluated by the MCP calculator (its own server code, in-process:
   `calcx.agent.calculator_inprocess`), and the annotation whose result was GSM8K's answer gives
   the new one;
4. the row asks for that answer exactly (its `rel_tol` field, HARD_REL_TOL, which the agent's
   reward reads as RESULT_REL_TOL), where GSM8K's rows keep Calc-X's 1e-2.

A problem whose numbers cannot all be rewritten consistently is skipped and named, by reason:
its annotations do not reproduce its answer (`result_mismatch`, `answer_not_annotated`), a step
was done outside an annotation (`unannotated_step`: a number that is neither the question's, an
earlier result, nor a constant the question states in digits or words: `twice`, `a dozen`),
a number is both an enlarged question number and an earlier result (`ambiguous_number`), nothing
the annotations use can be enlarged (`nothing_to_enlarge`), or with every factor tried the answer
stops being whole (`not_whole`), a step turns negative (`sign_changed`) or the calculator refuses
a step (`calculator_error`).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from calcx.agent.calculator_inprocess import call
from calcx.contract.env import REL_TOL_FIELD
from calcx.data.hard_split import FACTOR_RANGE, HARD_SOURCE, check_factor_range, id_suffix
from calcx.data.traces import Skipped, TraceError, annotation_pairs, check_bounded, same_result

#: A hard problem's answer is exact (the MCP calculator's), so it is scored as exact, floats'
#: rounding aside: under Calc-X's 1e-2 a head estimate within 1% of a six-digit product would count
HARD_REL_TOL = 1e-9
# numbers a question uses as units or plain fractions: kept as they are, so that `half`, `a dozen`
# or `60 minutes` keep meaning what they say (and a constant in an expression is one of these)
KEPT = frozenset({2, 3, 4, 7, 10, 12, 24, 30, 52, 60, 100, 365, 1000})
# the words that state a constant an expression may use without the question writing its digits
CONSTANT_WORDS: dict[float, tuple[str, ...]] = {
    2.0: ("two", "twice", "double", "half", "halves", "pair", "both", "second", "couple"),
    3.0: ("three", "thrice", "triple", "third"),
    4.0: ("four", "quarter", "fourth", "quadruple"),
    5.0: ("five", "fifth"),
    6.0: ("six", "sixth"),
    7.0: ("seven", "week"),
    8.0: ("eight",),
    9.0: ("nine",),
    10.0: ("ten", "tenth", "decade"),
    12.0: ("twelve", "dozen", "month", "year", "foot", "feet", "inch"),
    24.0: ("hour", "day"),
    30.0: ("thirty", "month"),
    52.0: ("week", "year"),
    60.0: ("sixty", "minute", "hour", "second"),
    100.0: ("hundred", "percent", "%", "cent", "dollar", "meter", "century"),
    365.0: ("year",),
    1000.0: ("thousand", "kilo", "gram", "liter", "litre", "mile"),
    0.5: ("half", "halves"),
    0.25: ("quarter", "fourth"),
    0.75: ("three quarter", "three-quarter", "three fourths"),
    0.1: ("tenth", "10%", "ten percent"),
    0.01: ("percent", "%", "cent"),
}
YEARS = range(1900, 2101)
MAX_ANSWER = 10**15
_QUESTION_NUMBER_RE = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?![\d])|(?<![\d.,])\d+(?:\.\d+)?(?![\d])")
_EXPRESSION_NUMBER_RE = re.compile(r"\d*\.\d+|\d+")
_PERCENT_RE = re.compile(r"\s?(%|percent)")


@dataclass(frozen=True)
class HardProblem:
    """One rewritten problem: the Calc-X row and the factor its numbers were scaled by."""

    row: dict[str, Any]
    factor: int
    calls: int  # calculator calls made for the kept rewrite


@dataclass
class HardResult:
    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    calls: int = 0


def _value(text: str) -> float:
    return float(text.replace(",", ""))


def _text(value: float) -> str:
    """A number as an expression and an answer write it: whole numbers without a decimal point."""
    if math.isfinite(value) and value == int(value) and abs(value) < 1e17:
        return str(int(value))
    return repr(value)


def _whole(value: float) -> bool:
    return math.isfinite(value) and abs(value - round(value)) <= 1e-9 * max(1.0, abs(value))


def question_numbers(question: str) -> tuple[dict[float, str], set[float]]:
    """(the numbers that are scaled, value -> the text it is first written as; the values kept):
    scaled are whole numbers of at least 2, neither a unit of `KEPT`, a year, nor a percentage or
    an ordinal (`20%`, `5th`); a value the question also writes as a kept number stays kept."""
    scaled: dict[float, str] = {}
    kept: set[float] = set()
    for match in _QUESTION_NUMBER_RE.finditer(question):
        text = match.group(0)
        value = _value(text)
        after = question[match.end() : match.end() + 1]
        if (
            "." in text
            or _PERCENT_RE.match(question, match.end())
            or after.isalpha()
            or value < 2
            or int(value) in KEPT
            or int(value) in YEARS
        ):
            kept.add(value)
            continue
        scaled.setdefault(value, text)
    return {v: t for v, t in scaled.items() if v not in kept}, kept


def rewrite_question(question: str, mapping: dict[float, int]) -> str:
    """The question with each scaled number replaced by its new value, written as the old one was
    (`1,200` -> `421,200`)."""
    scaled, _ = question_numbers(question)

    def replace(match: re.Match[str]) -> str:
        text = match.group(0)
        value = _value(text)
        if value in scaled and value in mapping and "." not in text:
            after = question[match.end() : match.end() + 1]
            if not after.isalpha() and not _PERCENT_RE.match(question, match.end()):
                return f"{mapping[value]:,}" if "," in text else str(mapping[value])
        return text

    return _QUESTION_NUMBER_RE.sub(replace, question)


def explained(value: float, question: str, kept: Collection[float]) -> bool:
    """Whether a constant of an expression is one the question states: 0 or 1, a number the
    question keeps (`5 apples`, `20%`), or a number its words say (`twice`, `a dozen`, `percent`).
    Anything else was computed in the reasoning's text, from numbers scaling would change."""
    if value in (0.0, 1.0) or value in kept:
        return True
    words = CONSTANT_WORDS.get(value, ())
    text = question.lower()
    return any(re.search(rf"\b{re.escape(word)}", text) for word in words)


class _Inconsistent(TraceError):
    """A rewrite that failed for this factor; another factor may succeed."""


async def _evaluate(expression: str) -> float:
    check_bounded(expression)
    text, is_error = await call("calculate", {"expression": expression})
    if is_error:
        raise _Inconsistent("calculator_error", f"{expression!r}: {text}")
    try:
        value = float(text)
    except ValueError:
        raise _Inconsistent("calculator_error", f"{expression!r}: the calculator answered {text!r}") from None
    if not math.isfinite(value):
        raise _Inconsistent("calculator_error", f"{expression!r}: {text}")
    return value


def plan_expressions(
    pairs: Sequence[tuple[str, str]], question_text: str, enlarged: Collection[float], kept: Collection[float] = ()
) -> list[list[tuple[str, str]]]:
    """For each annotation, its expression cut into (text, kind) pieces: `q` an enlarged question
    number, `r<i>` annotation i's result, `c` a constant the question states (`explained`), `t`
    other text. TraceError when a number is none of these (`unannotated_step`) or both of the first
    two (`ambiguous_number`)."""
    question = set(enlarged)
    results: dict[float, int] = {}
    plans = []
    for index, (expression, result) in enumerate(pairs):
        pieces: list[tuple[str, str]] = []
        last = 0
        for match in _EXPRESSION_NUMBER_RE.finditer(expression):
            pieces.append((expression[last : match.start()], "t"))
            value = _value(match.group(0))
            earlier = results.get(value)
            if value in question and earlier is not None:
                raise TraceError(
                    "ambiguous_number",
                    f"{match.group(0)} in <<{expression}={result}>> is a question number and a result",
                )
            if value in question:
                kind = "q"
            elif earlier is not None:
                kind = f"r{earlier}"
            elif explained(value, question_text, kept):
                kind = "c"
            else:
                raise TraceError(
                    "unannotated_step",
                    f"{match.group(0)} in <<{expression}={result}>> is no "
                    "question number, earlier result or constant the question states",
                )
            pieces.append((match.group(0), kind))
            last = match.end()
        pieces.append((expression[last:], "t"))
        plans.append(pieces)
        try:
            results.setdefault(_value(result), index)
        except ValueError:
            raise TraceError("no_result", f"<<{expression}={result}>>: {result!r} is not a number") from None
    return plans


async def _rewrite(
    plans: list[list[tuple[str, str]]], originals: Sequence[float], factor: int, mapping: dict[float, int]
) -> tuple[list[str], list[float]]:
    expressions: list[str] = []
    values: list[float] = []
    for plan, original in zip(plans, originals):
        parts = []
        for text, kind in plan:
            if kind == "q":
                parts.append(str(mapping[_value(text)]))
            elif kind.startswith("r"):
                parts.append(_text(values[int(kind[1:])]))
            else:
                parts.append(text)
        expression = "".join(parts)
        value = await _evaluate(expression)
        if original >= 0 > value:
            raise _Inconsistent("sign_changed", f"{expression} = {_text(value)} (was {_text(original)})")
        expressions.append(expression)
        values.append(value)
    return expressions, values


def factors(problem_id: str, seed: int, factor_range: tuple[int, int] = FACTOR_RANGE) -> list[int]:
    """The factors tried for one problem, in order, until one gives a consistent problem, each drawn
    from the range: any, a multiple of 4 (a whole half or quarter), a multiple of 100 (a whole
    percentage); the same for the same id, seed and range."""
    low, high = factor_range
    check_factor_range(low, high)
    rng = random.Random(hashlib.sha256(f"{seed}\0{problem_id}".encode()).digest())
    return [
        rng.randint(low, high),
        4 * rng.randint(-(-low // 4), high // 4),
        100 * rng.randint(-(-low // 100), high // 100),
    ]


async def harden(
    row: dict[str, Any], seed: int = 0, factor_range: tuple[int, int] = FACTOR_RANGE, source: str = HARD_SOURCE
) -> HardProblem:
    """The hard version of one imported GSM8K row (`id`, `question`, `chain`, `result`) in the split
    `source` names, or TraceError naming why it cannot be made."""
    suffix = id_suffix(source)
    question, answer = str(row["question"]), str(row["result"])
    pairs = annotation_pairs(str(row["chain"]))
    originals = []
    calls = 0
    for expression, annotated in pairs:  # the annotations must reproduce themselves first
        try:
            calculated = await _evaluate(expression)
        except _Inconsistent as exc:
            raise TraceError("calculator_error", exc.detail) from None
        calls += 1
        if not same_result(annotated, _text(calculated)):
            raise TraceError("result_mismatch", f"<<{expression}={annotated}>>: the calculator answers {calculated}")
        originals.append(calculated)
    final = next((i for i in reversed(range(len(pairs))) if same_result(answer, pairs[i][1])), None)
    if final is None:
        raise TraceError("answer_not_annotated", f"no annotation's result is the answer {answer}")
    scaled, kept = question_numbers(question)
    enlarged = sorted(scaled)
    plans = plan_expressions(pairs, question, enlarged, kept)
    if not any(kind == "q" for plan in plans[: final + 1] for _, kind in plan):
        raise TraceError("nothing_to_enlarge", "the annotations use none of the question's scalable numbers")
    failure: TraceError | None = None
    for factor in factors(str(row["id"]), seed, factor_range):
        mapping = {value: int(value) * factor for value in enlarged}
        calls += len(pairs)
        try:
            expressions, values = await _rewrite(plans, originals, factor, mapping)
        except _Inconsistent as exc:
            failure = exc
            continue
        new_answer = values[final]
        if _whole(_value(answer)) and not _whole(new_answer):
            failure = TraceError("not_whole", f"factor {factor}: the answer would be {_text(new_answer)}")
            continue
        if abs(new_answer) > MAX_ANSWER:
            failure = TraceError("too_large", f"factor {factor}: the answer would be {_text(new_answer)}")
            continue
        shown = _text(round(new_answer)) if _whole(new_answer) else _text(new_answer)
        chain = "\n".join(f"<<{e}={_text(v)}>>" for e, v in zip(expressions, values))
        hard = {
            "id": f"{row['id']}{suffix}",
            "question": rewrite_question(question, mapping),
            "chain": chain,
            "result": shown,
            "source": source,
            REL_TOL_FIELD: HARD_REL_TOL,
        }
        return HardProblem(hard, factor, calls)
    assert failure is not None
    raise failure


def harden_rows(
    rows: Sequence[dict[str, Any]],
    origins: Sequence[str],
    *,
    seed: int = 0,
    limit: int | None = None,
    factor_range: tuple[int, int] = FACTOR_RANGE,
    source: str = HARD_SOURCE,
) -> HardResult:
    """Hard versions of the rows in order, each skip named by its origin; stops after `limit` kept."""

    async def run() -> HardResult:
        result = HardResult()
        for row, where in zip(rows, origins):
            if limit is not None and len(result.rows) >= limit:
                break
            try:
                problem = await harden(row, seed, factor_range, source)
            except TraceError as exc:
                result.skipped.append(Skipped(f"{where} ({row.get('id')})", exc.reason, exc.detail))
                continue
            result.rows.append(problem.row)
            result.calls += problem.calls
        return result

    return asyncio.run(run())
