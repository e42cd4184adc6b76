"""The seeded problem generator and `calcx data`."""

from __future__ import annotations

import math
import re
from fractions import Fraction

from calcx.agent.numeric import evaluate
from calcx.agent.reward import reward
from calcx.data.__main__ import main
from calcx.data.generator import TEMPLATES, format_value, generate_dataset
from calcx.data.io import read_rows
from calcx.stub_llm.player import format_number, option_letter
from calcx.stub_llm.script import chain_expression

STEP_RE = re.compile(r'<gadget id="calculator">(.*?)</gadget>\n<output>(.*?)</output>')


def test_same_seed_same_rows_other_seed_other_rows():
    a = generate_dataset(seed=1, train_size=50, test_size=20, mini_size=5)
    b = generate_dataset(seed=1, train_size=50, test_size=20, mini_size=5)
    c = generate_dataset(seed=2, train_size=50, test_size=20, mini_size=5)
    assert a == b
    assert a["train"] != c["train"]


def test_splits_are_disjoint_and_mini_is_head_of_test():
    data = generate_dataset(seed=0, train_size=300, test_size=60, mini_size=10)
    train_q = {r["question"] for r in data["train"]}
    assert len(train_q) == 300 and not train_q & {r["question"] for r in data["test"]}
    assert data["test_mini"] == data["test"][:10]
    assert {r["source"] for r in data["train"]} == set(TEMPLATES)
    assert len({r["id"] for r in data["train"] + data["test"]}) == 360


def test_every_chain_step_is_right_and_the_last_step_gives_the_result():
    for row in generate_dataset(seed=5, train_size=200, test_size=0, mini_size=0)["train"]:
        steps = STEP_RE.findall(row["chain"])
        assert steps, row
        for expression, output in steps:
            value = evaluate(expression)
            expected = evaluate(output.split(" = around ")[0])
            assert math.isclose(value, expected, rel_tol=1e-9), row
        last = chain_expression(row["chain"])
        assert last is not None, row
        final = evaluate(last)
        answer = option_letter(row["question"], final) if row["source"] == "aqua_rat" else format_number(final)
        assert answer is not None and reward(answer, row["result"]) == 1.0, row
        assert f"<result>{row['result']}</result>" in row["chain"]


def test_format_value_follows_calcx():
    assert format_value(Fraction(12)) == "12"
    assert format_value(Fraction(5, 2)) == "2.5"
    assert format_value(Fraction(2, 3)) == "2/3 = around 0.666667"


def test_cli_generate_and_validate(tmp_path, capsys):
    out = tmp_path / "data"
    args = [
        "generate",
        "--out",
        str(out),
        "--train-size",
        "40",
        "--test-size",
        "12",
        "--mini-size",
        "4",
        "--sample-size",
        "3",
    ]
    assert main(args) == 0
    assert [
        len(read_rows(out / n)) for n in ("train.parquet", "test.parquet", "test_mini.parquet", "sample.jsonl")
    ] == [40, 12, 4, 3]
    assert main(args) == 2
    assert "--force" in capsys.readouterr().err
    assert main(args + ["--force"]) == 0
    assert main(["validate", str(out / "train.parquet"), str(out / "sample.jsonl")]) == 0
    (tmp_path / "bad.jsonl").write_text('{"id": "x"}\n')
    assert main(["validate", str(tmp_path / "bad.jsonl")]) == 1
    assert "row 1: field 'question' is missing" in capsys.readouterr().err


def test_cli_rejects_mini_larger_than_test(tmp_path, capsys):
    assert main(["generate", "--out", str(tmp_path), "--test-size", "3", "--mini-size", "5"]) == 2
    assert "cannot exceed" in capsys.readouterr().err
