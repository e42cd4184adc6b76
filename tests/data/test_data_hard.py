"""`calcx data harden`: GSM8K rows with their numbers made large, answers recomputed through the
calculator, and every row that cannot be rewritten consistently skipped and named.

The reference for every kept answer is the agent's real MCP calculator over stdio
(calculator_client), not the in-process copy the command itself uses.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from calculator_client import calculator_answers

import calcx.data.__main__  # noqa: F401  (calcx.cli loads it by name; importing it here makes Pants ship it)
from calcx.cli import main
from calcx.data.hard import HARD_REL_TOL, HARD_SOURCE, factors, harden, question_numbers
from calcx.data.io import read_rows
from calcx.data.traces import ANNOTATION_RE, TraceError, same_result


def _row(rid: str, question: str, chain: str, result: str) -> dict[str, str]:
    return {"id": rid, "question": question, "chain": chain, "result": result, "source": "gsm8k"}


GOOD = [
    _row(
        "g1",
        "Ana sold 48 clips in April and half as many in May. How many clips did she sell?",
        "In May she sold 48/2 = <<48/2=24>>24 clips.\nIn all 48+24 = <<48+24=72>>72 clips.",
        "72",
    ),
    _row(
        "g2",
        "A coat costs $50. It is sold at half price. Tom buys 13 coats. What does he pay?",
        "One coat is 50*.5 = <<50*.5=25>>25.\nHe pays 25*13 = <<25*13=325>>325.",
        "325",
    ),
    _row(
        "g3",
        "A farm has 1,500 hens. Each lays 5 eggs a week. How many eggs in 3 weeks?",
        "A week: 1500*5 = <<1500*5=7500>>7500.\nThree weeks: 7500*3 = <<7500*3=22500>>22500.",
        "22500",
    ),
    _row(
        "g4",
        "Jo reads 18 pages a day for 14 days, then 11 more pages. How many pages?",
        "18*14 = <<18*14=252>>252, then 252+11 = <<252+11=263>>263.",
        "263",
    ),
]
BAD = [  # (row, the reason it is skipped for)
    (_row("b1", "Ann has 3 cats and 4 dogs. How many pets?", "3+4 = <<3+4=7>>7.", "7"), "nothing_to_enlarge"),
    (
        _row(
            "b2",
            "Bo has 15 red and 20 blue pens. He buys as many again. How many pens has he?",
            "He has 15+20 = 35 pens; with as many again that is <<35+35=70>>70.",
            "70",
        ),
        "unannotated_step",
    ),
    (
        _row(
            "b3",
            "Cy has 20 apples and 40 pears. He buys twice his apples in pears. How many pears?",
            "20*2 = <<20*2=40>>40; 40+40 = <<40+40=80>>80.",
            "80",
        ),
        "ambiguous_number",
    ),
    (_row("b4", "Di has 15 pens and buys 25. How many?", "15+25 = <<15+25=40>>40.", "41"), "answer_not_annotated"),
    (_row("b5", "Ed has 15 pens and buys 25. How many?", "15+25 = <<15+25=41>>41.", "41"), "result_mismatch"),
    (_row("b6", "Fay has 11 pens.", "She has 11 pens.", "11"), "no_annotation"),
]


def _harden(row: dict[str, str], seed: int = 0):
    return asyncio.run(harden(row, seed))


def test_numbers_scaled_by_one_factor_and_the_answer_recomputed() -> None:
    problem = _harden(GOOD[0])
    f = problem.factor
    assert f in factors("g1", 0)
    assert problem.row == {
        "id": "g1-hard",
        "source": HARD_SOURCE,
        "result": str(72 * f),
        "question": f"Ana sold {48 * f} clips in April and half as many in May. How many clips did she sell?",
        "chain": f"<<{48 * f}/2={24 * f}>>\n<<{48 * f}+{24 * f}={72 * f}>>",
        "rel_tol": HARD_REL_TOL,  # the calculator's answer is exact: so is the score
    }
    # a decimal written `.5` stays the constant it is; `13` is scaled with the rest
    coat = _harden(GOOD[1])
    assert coat.row["result"] == str(25 * 13 * coat.factor**2)
    assert f"${50 * coat.factor}" in coat.row["question"] and "half price" in coat.row["question"]
    # `1,500` is written back with its thousands separator; 3 (a small count) stays, 5 is scaled
    hens = _harden(GOOD[2])
    f = hens.factor
    assert f"{1500 * f:,} hens. Each lays {5 * f} eggs a week. How many eggs in 3 weeks?" in hens.row["question"]
    assert hens.row["result"] == str(22500 * f * f)


def test_the_factor_comes_from_the_id_and_the_seed() -> None:
    assert factors("g4", 0) == factors("g4", 0) != factors("g4", 1)
    assert _harden(GOOD[3]).row == _harden(GOOD[3]).row
    assert _harden(GOOD[3], seed=1).row["result"] != _harden(GOOD[3]).row["result"]


def test_which_question_numbers_are_scaled() -> None:
    scaled, kept = question_numbers(
        "In 2019 she ran 3 races of 42 km, 25% uphill, the 5th in 1.5 hours; " "each cost $1,200 and 12 friends came."
    )
    assert scaled == {42.0: "42", 1200.0: "1,200"}
    assert kept == {2019.0, 3.0, 25.0, 5.0, 1.5, 12.0}
    # a value the question also writes as a percentage is kept everywhere
    assert question_numbers("20 apples, 20% of them rotten")[0] == {}


@pytest.mark.parametrize("row,reason", BAD, ids=[r for _, r in BAD])
def test_rows_that_cannot_be_rewritten_consistently_are_named(row: dict[str, str], reason: str) -> None:
    with pytest.raises(TraceError) as caught:
        _harden(row)
    assert caught.value.reason == reason


def test_harden_command_every_kept_answer_is_the_mcp_calculators(tmp_path: Path, capsys) -> None:
    src = tmp_path / "test.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in [GOOD[0], *[r for r, _ in BAD], *GOOD[1:]]), encoding="utf-8")
    out = tmp_path / "test-hard.parquet"
    assert main(["data", "harden", str(src), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[-1].startswith(f"wrote {out} (4 hard rows, ")
    assert (
        "skipped 6 rows (ambiguous_number 1, answer_not_annotated 1, no_annotation 1, nothing_to_enlarge 1, "
        "result_mismatch 1, unannotated_step 1)" in captured.err
    )
    skipped = [json.loads(line) for line in (tmp_path / "test-hard.skipped.jsonl").read_text().splitlines()]
    assert [(s["where"], s["reason"]) for s in skipped] == [
        (f"{src}: row {n} (b{n - 1})", reason) for n, (_, reason) in enumerate(BAD, start=2)
    ]

    rows = read_rows(out)
    assert [r["id"] for r in rows] == ["g1-hard", "g2-hard", "g3-hard", "g4-hard"]
    marks = [mark.rpartition("=") for row in rows for mark in ANNOTATION_RE.findall(row["chain"])]
    answers = asyncio.run(calculator_answers([expression for expression, _, _ in marks]))
    assert all(same_result(value, answer) for (_, _, value), answer in zip(marks, answers, strict=True))
    for row in rows:  # the answer is the last step's, as the MCP calculator computes it
        last = ANNOTATION_RE.findall(row["chain"])[-1].rpartition("=")[0]
        assert same_result(row["result"], asyncio.run(calculator_answers([last]))[0])
        assert int(row["result"]) > 10_000  # made hard
        assert row["rel_tol"] == HARD_REL_TOL  # and scored exactly, through the file

    assert main(["data", "harden", str(src), "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    limited = tmp_path / "two.jsonl"
    assert main(["data", "harden", str(src), "--out", str(limited), "--limit", "2"]) == 0
    assert [r["id"] for r in read_rows(limited)] == ["g1-hard", "g2-hard"]


# `calcx data harden` of GOOD (seed 0) before --factor-range and --source existed, byte for byte
GOOD_HARD_JSONL = (
    '{"id": "g1-hard", "question": "Ana sold 9072 clips in April and half as many in May. How many clips did she '
    'sell?", "chain": "<<9072/2=4536>>\\n<<9072+4536=13608>>", "result": "13608", "source": "gsm8k-hard", '
    '"rel_tol": 1e-09}\n'
    '{"id": "g2-hard", "question": "A coat costs $9250. It is sold at half price. Tom buys 2405 coats. What does he '
    'pay?", "chain": "<<9250*.5=4625>>\\n<<4625*2405=11123125>>", "result": "11123125", "source": "gsm8k-hard", '
    '"rel_tol": 1e-09}\n'
    '{"id": "g3-hard", "question": "A farm has 661,500 hens. Each lays 2205 eggs a week. How many eggs in 3 weeks?", '
    '"chain": "<<661500*2205=1458607500>>\\n<<1458607500*3=4375822500>>", "result": "4375822500", '
    '"source": "gsm8k-hard", "rel_tol": 1e-09}\n'
    '{"id": "g4-hard", "question": "Jo reads 2952 pages a day for 2296 days, then 1804 more pages. How many pages?", '
    '"chain": "<<2952*2296=6777792>>\\n<<6777792+1804=6779596>>", "result": "6779596", "source": "gsm8k-hard", '
    '"rel_tol": 1e-09}\n'
)
# factors(id, seed) of the same code: (id, seed) -> [any, a multiple of 4, a multiple of 100]
TODAYS_FACTORS = {
    ("g1", 0): [189, 224, 300],
    ("g4", 0): [164, 964, 900],
    ("gsm8k-0", 0): [507, 716, 300],
    ("gsm8k-1", 0): [188, 116, 200],
    ("gsm8k-4", 0): [535, 648, 500],
    ("gsm8k-1", 1): [563, 880, 400],
    ("gsm8k-3", 1): [390, 240, 700],
}
HARDER = ["--factor-range", "1001", "9999", "--source", "gsm8k-harder"]


def _harden_file(tmp_path: Path, rows: list[dict[str, str]], out: str, *flags: str) -> list[dict]:
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert main(["data", "harden", str(src), "--out", str(tmp_path / out), *flags]) == 0
    return read_rows(tmp_path / out)


def test_the_default_range_and_source_make_the_split_they_made_before(tmp_path: Path) -> None:
    assert {key: factors(*key) for key in TODAYS_FACTORS} == TODAYS_FACTORS
    _harden_file(tmp_path, GOOD, "hard.jsonl")
    assert (tmp_path / "hard.jsonl").read_text(encoding="utf-8") == GOOD_HARD_JSONL
    _harden_file(tmp_path, GOOD, "named.jsonl", "--factor-range", "101", "999", "--source", "gsm8k-hard")
    assert (tmp_path / "named.jsonl").read_text(encoding="utf-8") == GOOD_HARD_JSONL


@pytest.mark.parametrize("low,high", [(1001, 9999), (10001, 99999), (100, 100), (2, 100)])
def test_each_factor_tried_is_drawn_from_the_range(low: int, high: int) -> None:
    for n in range(200):
        anything, quarter, percent = factors(f"gsm8k-train-{n}", 0, (low, high))
        assert all(low <= f <= high for f in (anything, quarter, percent))
        assert quarter % 4 == 0 and percent % 100 == 0


def test_a_harder_split_keeps_its_own_source_ids_and_range(tmp_path: Path) -> None:
    """`--factor-range 1001 9999 --source gsm8k-harder`: rows validated beside the default split's,
    told apart by source and id, every number scaled by one factor in the range, every kept answer
    the MCP calculator's."""
    rows = [*GOOD, *(r for r, _ in BAD)]
    harder = _harden_file(tmp_path, rows, "test-harder.parquet", *HARDER)
    default = _harden_file(tmp_path, rows, "test-hard.parquet")
    assert [r["id"] for r in harder] == ["g1-harder", "g2-harder", "g3-harder", "g4-harder"]
    assert {r["source"] for r in harder} == {"gsm8k-harder"}
    assert not {r["id"] for r in harder} & {r["id"] for r in default}
    originals = {r["id"]: r for r in GOOD}
    for row in harder:  # the factor, read from the question itself: one for all its scaled numbers
        before = originals[row["id"].removesuffix("-harder")]["question"]
        scaled = question_numbers(before)[0]
        old = [float(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", before)]
        new = [float(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", row["question"])]
        ratios = {b / a for a, b in zip(old, new, strict=True) if a in scaled}
        assert len(ratios) == 1 and 1001 <= ratios.pop() <= 9999, (row["question"], before)
    marks = [mark.rpartition("=") for row in harder for mark in ANNOTATION_RE.findall(row["chain"])]
    answers = asyncio.run(calculator_answers([expression for expression, _, _ in marks]))
    assert all(same_result(value, answer) for (_, _, value), answer in zip(marks, answers, strict=True))
    lasts = [ANNOTATION_RE.findall(row["chain"])[-1].rpartition("=")[0] for row in harder]
    assert all(same_result(r["result"], a) for r, a in zip(harder, asyncio.run(calculator_answers(lasts))))


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--factor-range", "1", "999"], "--factor-range 1 999: LOW must be at least 2"),
        (["--factor-range", "999", "101"], "--factor-range 999 101: HIGH must be at least LOW"),
        (["--factor-range", "101", "199"], "--factor-range 101 199: the range must hold a multiple of 100"),
        (["--source", "gsm8k"], "--source gsm8k: must be gsm8k-<tag>"),
        (["--source", "gsm8k-hard-2"], "--source gsm8k-hard-2: must be gsm8k-<tag>"),
        (["--factor-range", "1001", "9999"], "--factor-range 1001 9999 needs a --source of its own"),
    ],
)
def test_a_range_or_source_that_cannot_make_a_split_is_refused(
    tmp_path: Path, capsys, flags: list[str], message: str
) -> None:
    src = tmp_path / "rows.jsonl"
    src.write_text(json.dumps(GOOD[0]) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert main(["data", "harden", str(src), "--out", str(out), *flags]) == 2
    assert f"calcx data: error: {message}" in capsys.readouterr().err
    assert not out.exists()
