"""Reward semantics and hostile answers (each must return quickly and never match)."""

from __future__ import annotations

import time

import pytest

from calcx.agent.answer import extract_answer
from calcx.agent.numeric import NumericError, evaluate
from calcx.agent.reward import reward, scalar_are_results_same
from calcx.contract.env import parse_rel_tol


@pytest.mark.parametrize(
    "pred, true",
    [
        ("42", "42"),
        ("  42 ", "42"),
        ("C", "C"),
        ("(c)", "C"),
        ("C)", "C"),
        ("option C", "C"),
        ("2/3", "0.666667"),
        ("0.666667", "2/3 = around 0.666667"),
        ("2/3", "2/3 = around 0.666667"),
        ("1/4", "0.25"),
        ("1,000", "1000"),
        ("1_000", "1000"),
        ("$1,234.50", "1234.5"),
        ("50%", "50"),
        ("50%", "0.5"),
        ("100.5", "100"),  # within the 1 % relative tolerance
        ("12 * 3 = 36", "36"),
        ("\\frac{1}{4}", "0.25"),
        ("\\boxed{36}", "36"),
        ("36.", "36"),
        ("2^10", "1024"),
        ("-3", "-3.0"),
    ],
)
def test_matches(pred, true):
    assert scalar_are_results_same(pred, true)
    assert reward(pred, true) == 1.0


@pytest.mark.parametrize(
    "pred, true",
    [
        ("43", "42"),
        ("102", "100"),  # 2 % off
        ("B", "C"),
        ("3", "C"),
        ("C", "3"),
        ("", "42"),
        ("The result is 42.", "42"),
        ("unknown", "42"),
        ("1/0", "1"),
        ("42 apples and 7 pears", "42"),
        ("0.5", "50"),
    ],
)
def test_mismatches(pred, true):
    assert not scalar_are_results_same(pred, true)
    assert reward(pred, true) == 0.0


HOSTILE = [
    "9**9**9",
    "9^9^9^9",
    "10**10**10**10",
    "(" * 5000 + "1" + ")" * 5000,
    "-" * 100_000 + "1",
    "1" * 10_000_000,
    " " * 10_000_000 + "1",
    "1/3" * 1_000_000,
    "__import__('os').system('touch /tmp/calcx-pwned')",
    "().__class__.__bases__[0].__subclasses__()",
    "exec('import os')",
    "lambda: 1",
    "1e308 * 1e308",
    "nan",
    "inf",
    "1" + "0" * 5000,
]


@pytest.mark.parametrize("pred", HOSTILE, ids=[f"hostile{i}" for i in range(len(HOSTILE))])
def test_hostile_answers_return_quickly_and_do_not_match(pred):
    started = time.monotonic()
    assert reward(pred, "42") == 0.0
    assert reward("42", pred) == 0.0
    # milliseconds here; the ceiling tells a hang (9**9**9 evaluated) from a slow machine
    assert time.monotonic() - started < 30.0


def test_hostile_text_is_never_executed(tmp_path):
    target = tmp_path / "pwned"
    assert reward(f"__import__('os').system('touch {target}')", "0") == 0.0
    assert not target.exists()


@pytest.mark.parametrize(
    "expr, value",
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("2 ** 3 ** 2", 512),
        ("-2 ^ 2", -4),
        ("7 / 2", 3.5),
        ("50%", 0.5),
        ("3 × 4 ÷ 2", 6),
    ],
)
def test_parser_precedence(expr, value):
    assert evaluate(expr) == pytest.approx(value)


@pytest.mark.parametrize("expr", ["", "1 +", "(1", "1 2", "abs(3)", "2 ** 5000", "1e999", "1/0"])
def test_parser_rejects(expr):
    with pytest.raises(NumericError):
        evaluate(expr)


@pytest.mark.parametrize("truth", ["3", "5", "3.0", "5/1"])
def test_around_with_disagreeing_sides_matches_neither(truth):
    """`3 = around 5` is no number: scoring it 1 for either side would train a hedge."""
    assert not scalar_are_results_same("3 = around 5", truth)
    assert reward(extract_answer("So ### ANSWER: 3 = around 5 ###"), truth) == 0.0


@pytest.mark.parametrize(
    "pred, true, same",
    [
        ("2/3 = around 0.67", "0.666667", True),  # sides agree within 1 %: the fraction's value
        ("2/3 = around 0.67", "2/3 = around 0.666667", True),
        ("0.67", "2/3 = around 0.9", False),  # a truth whose sides disagree matches nothing
        ("0.9", "2/3 = around 0.9", False),
    ],
)
def test_around_reads_one_number_when_the_sides_agree(pred, true, same):
    assert scalar_are_results_same(pred, true) is same


@pytest.mark.parametrize(
    "pred, true, same",
    [
        ("x = 36", "36", True),  # the value after the last `=`, not the name before it
        ("a = b = 7", "7", True),
        ("36 = 12", "12", True),
        ("36 = 12", "36", False),  # the left side is not the answer
    ],
)
def test_equation_answer_is_its_last_part(pred, true, same):
    assert scalar_are_results_same(pred, true) is same


def test_a_rows_own_tolerance_decides_how_close_an_answer_must_come():
    """Calc-X's 1e-2 by default (a head estimate 0.5% off counts); a row asking for the exact
    answer (the hard split's 1e-9) takes only the answer itself, floats' rounding aside."""
    assert reward("63,648", "63648") == reward("63648.0", "63648", 1e-9) == 1.0
    assert reward("63968", "63648") == 1.0  # 0.5% off
    assert reward("63968", "63648", 1e-9) == 0.0
    assert reward(repr(0.1 * 3 * 10**5), "30000", 1e-9) == 1.0  # 30000.000000000004
    assert reward("63649", "63648", 0.0) == 0.0 and reward("63648", "63648", 0.0) == 1.0
    # Calc-X's `A = around B` is one number when its sides agree to Calc-X's 1e-2, whatever the row asks
    assert reward("2/3 = around 0.666667", "0.6666666666666666", 1e-9) == 1.0
    assert reward("0.666667", "0.6666666666666666", 1e-9) == 0.0  # the rounded side alone is not exact


@pytest.mark.parametrize("value", ["1e-9", 1e-9, " 0.01 ", 0, "0", "0." + "0" * 120 + "1"])
def test_parse_rel_tol_reads_a_tolerance(value):
    assert parse_rel_tol(value) == float(str(value))  # the whole text, however long


@pytest.mark.parametrize("value", ["exact", "", "-0.01", "1", "1.5", "nan", "inf", True, None])
def test_parse_rel_tol_refuses_what_is_not_one_and_names_the_setting(value):
    with pytest.raises(ValueError, match="RESULT_REL_TOL must be a relative tolerance from 0 \\(exact\\) up to 1"):
        parse_rel_tol(value, what="RESULT_REL_TOL")
