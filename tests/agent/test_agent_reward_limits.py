"""The reward parser at its documented limits (docs/agent.md, "Reward"): each limit is pinned
exactly at the boundary (accepted) and just past it (refused), both in the arithmetic parser
(`calcx.agent.numeric.evaluate`) and through the reward a rollout gets.

The numbers here are written out, not read from the module's constants: a change of a limit
must show up as a failing test and a docs change, not pass silently.
"""

from __future__ import annotations

import pytest

from calcx.agent.numeric import NumericError, evaluate
from calcx.agent.reward import reward, scalar_are_results_same

# -- nesting depth: 32 levels accepted, the 33rd refused ----------------------------------------


def parens(depth: int) -> str:
    return "(" * depth + "7" + ")" * depth


def signs(depth: int) -> str:
    return "-" * depth + "7"  # each unary sign is one level


def towers(depth: int) -> str:
    return "1^" * depth + "1"  # each exponent is one level (right-associative)


NESTINGS = [parens, signs, towers]


@pytest.mark.parametrize("nest", NESTINGS, ids=lambda f: f.__name__)
def test_nesting_depth_32_is_evaluated(nest) -> None:
    expected = {"parens": 7.0, "signs": 7.0, "towers": 1.0}[nest.__name__]  # 32 signs: even, positive
    assert evaluate(nest(32)) == expected


@pytest.mark.parametrize("nest", NESTINGS, ids=lambda f: f.__name__)
def test_nesting_depth_33_is_refused(nest) -> None:
    with pytest.raises(NumericError, match="nesting deeper than 32"):
        evaluate(nest(33))


def test_nesting_limit_through_the_reward() -> None:
    assert reward(parens(32), "7") == 1.0
    assert reward(parens(33), "7") == 0.0
    assert reward("7", parens(32)) == 1.0  # the truth side goes through the same parser
    assert reward("7", parens(33)) == 0.0


# -- expression length: 512 characters accepted, 513 refused ------------------------------------


def test_expression_of_512_characters_is_evaluated() -> None:
    padded = " " * 511 + "7"
    assert len(padded) == 512 and evaluate(padded) == 7.0
    digits = "0" * 511 + "7"
    assert len(digits) == 512 and evaluate(digits) == 7.0


def test_expression_of_513_characters_is_refused() -> None:
    with pytest.raises(NumericError, match="longer than 512 characters"):
        evaluate(" " * 512 + "7")
    with pytest.raises(NumericError, match="longer than 512 characters"):
        evaluate("0" * 512 + "7")


def test_length_limit_through_the_reward() -> None:
    # No whitespace: the reward strips it before parsing, the digits reach the parser as they are.
    assert reward("0" * 511 + "7", "7") == 1.0
    assert reward("0" * 512 + "7", "7") == 0.0
    assert reward("7", "0" * 511 + "7") == 1.0
    assert reward("7", "0" * 512 + "7") == 0.0
    # \boxed{...} holds at most 512 characters too (and its content is the expression).
    assert reward("\\boxed{" + "0" * 511 + "7}", "7") == 1.0
    assert reward("\\boxed{" + "0" * 512 + "7}", "7") == 0.0


# -- tokens: 256 accepted, 257 refused ------------------------------------------------------------


def test_256_tokens_are_evaluated_and_257_refused() -> None:
    at_limit = "-1" + "+1" * 127  # 2 + 2 * 127 = 256 tokens
    assert evaluate(at_limit) == 126.0
    past = "1" + "+1" * 128  # 1 + 2 * 128 = 257 tokens
    with pytest.raises(NumericError, match="more than 256 tokens"):
        evaluate(past)
    assert reward(at_limit, "126") == 1.0
    assert reward(past, "129") == 0.0


# -- exponent: |exponent| <= 1000 ----------------------------------------------------------------


@pytest.mark.parametrize("expr", ["1^1000", "1**1000", "1^-1000", "1^(1000)", "1^(999.5+0.5)"])
def test_exponent_of_magnitude_1000_is_evaluated(expr: str) -> None:
    assert evaluate(expr) == 1.0


@pytest.mark.parametrize("expr", ["1^1001", "1**1001", "1^-1001", "1^1000.001", "1^-1000.001"])
def test_exponent_past_1000_is_refused(expr: str) -> None:
    with pytest.raises(NumericError, match="exponent too large"):
        evaluate(expr)


def test_exponent_limit_through_the_reward() -> None:
    assert reward("1^1000", "1") == 1.0
    assert reward("1^1001", "1") == 0.0
    assert reward("1", "1^-1000") == 1.0
    assert reward("1", "1^-1001") == 0.0


# -- magnitude: |value| <= 1e100 -----------------------------------------------------------------

JUST_PAST_1E100 = "1.0000000000000002e+100"  # the next double after 1e100


def test_magnitude_1e100_is_evaluated() -> None:
    assert float(JUST_PAST_1E100) > 1e100  # the fixture really is past the limit
    assert evaluate("1e100") == 1e100
    assert evaluate("-1e100") == -1e100
    assert evaluate("10^100") == 1e100  # a computed result exactly at the limit
    assert evaluate("1e100 / 1") == 1e100


@pytest.mark.parametrize(
    "expr",
    [JUST_PAST_1E100, "-" + JUST_PAST_1E100, "1e100 * 1.0000000000000002", "1e100 + 1e100", "-1e100 - 1e100", "10^101"],
)
def test_magnitude_past_1e100_is_refused(expr: str) -> None:
    with pytest.raises(NumericError):
        evaluate(expr)


def test_magnitude_limit_through_the_reward() -> None:
    assert reward("1.0e100", "1e100") == 1.0  # numerically equal, textually different
    assert reward("-1.0e100", "-1e100") == 1.0
    # Within 1 % of the truth, yet refused: the value itself is out of range.
    assert reward(JUST_PAST_1E100, "1e100") == 0.0
    assert reward("1e100", JUST_PAST_1E100) == 0.0


# -- relative tolerance 1 %, on both sides of the edge -------------------------------------------
# math.isclose(p, t, rel_tol=0.01): |p - t| <= 0.01 * max(|p|, |t|).


@pytest.mark.parametrize(
    "pred, true",
    [
        ("99", "100"),  # exactly 1 % below: at the edge, matches
        ("100", "99"),  # exactly 1 % of the larger value above the truth: at the edge, matches
        ("99.01", "100"),  # just inside, below
        ("101.01", "100"),  # just inside, above (1.01 <= 1.0101)
        ("-99", "-100"),  # sign does not matter
        ("0.9901", "1"),  # (0.99 vs 1 is the edge in decimal but not in binary floating point)
        ("990000", "1000000"),  # exactly 1 % below, large integers
    ],
)
def test_within_one_percent_matches(pred: str, true: str) -> None:
    assert scalar_are_results_same(pred, true)
    assert reward(pred, true) == 1.0


@pytest.mark.parametrize(
    "pred, true",
    [
        ("98.99", "100"),  # just past, below (1.01 > 1.0)
        ("98.9999", "100"),  # 0.01 % of the tolerance past the edge, below (1.0001 > 1.0)
        ("100", "98.99"),  # just past, above
        ("100", "98.9999"),
        ("101.02", "100"),  # just past, above (1.02 > 1.0102)
        ("101.0102", "100"),  # (1.0102 > 1.010102)
        ("-98.99", "-100"),
        ("0.9899", "1"),
        ("989999", "1000000"),
    ],
)
def test_just_past_one_percent_does_not_match(pred: str, true: str) -> None:
    assert not scalar_are_results_same(pred, true)
    assert reward(pred, true) == 0.0
