"""`calcx data import`: GSM8K and Calc-X files in, calcx's dataset files out, bad rows named."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import calcx.data.__main__  # noqa: F401  (calcx.cli loads it by name; importing it here makes Pants ship it)
from calcx.cli import main
from calcx.data.importers import import_files, read_source, split_rows
from calcx.data.io import read_rows

# Made-up problems in GSM8K's layout (the real file stays out of the repository).
GSM8K = [
    {
        "question": "Ana has 3 boxes of 4 pens. How many pens?",
        "answer": "3 boxes of 4 is 3*4=<<3*4=12>>12 pens.\n#### 12",
    },
    {
        "question": "A farm sells 1,000 eggs a day for 2 days. How many eggs?",
        "answer": "It sells 1000*2=<<1000*2=2000>>2000 eggs.\n#### 2,000",
    },
    {"question": "Bo had 10 cards and lost 13. What is his balance?", "answer": "10-13=<<10-13=-3>>-3\n####  -3 "},
    {"question": "Half of 5 liters is how much?", "answer": "5/2=<<5/2=2.5>>2.5 liters\n#### 2.5"},
]
CALCX = [
    {
        "id": f"ape-{i}",
        "question": f"What is {i} + {i}?",
        "chain": f'<gadget id="calculator">{i} + {i}</gadget>',
        "result": str(2 * i),
        "source": "ape210k",
    }
    for i in range(1, 9)
]
# GSM8K's own train.jsonl (MIT; never copied into the repository): .ci/run points at a copy beside
# the clone when the machine has one.
REAL_GSM8K = Path(os.environ.get("CALCX_GSM8K_FILE", "") or "/nonexistent/gsm8k/train.jsonl")
OUTPUTS = ("train.parquet", "test.parquet", "test_mini.parquet", "sample.jsonl")


def write_jsonl(path: Path, rows: list, *, raw_lines: dict[int, str] | None = None) -> Path:
    lines = [json.dumps(r) for r in rows]
    for number, text in (raw_lines or {}).items():
        lines.insert(number - 1, text)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_gsm8k_rows_become_calcx_rows(tmp_path):
    result = read_source(write_jsonl(tmp_path / "train.jsonl", GSM8K))
    assert not result.problems and result.read == 4
    first, second, third, fourth = result.rows
    assert first == {
        "id": "gsm8k-train-1",
        "question": GSM8K[0]["question"],
        "chain": "3 boxes of 4 is 3*4=<<3*4=12>>12 pens.",
        "result": "12",
        "source": "gsm8k",
    }
    assert (second["id"], second["result"]) == ("gsm8k-train-2", "2000")
    assert third["result"] == "-3" and fourth["result"] == "2.5"


def test_gsm8k_parquet_and_line_numbers_count_blank_lines(tmp_path):
    from_parquet = read_source(write_parquet(tmp_path / "gsm.parquet", GSM8K)).rows
    assert [r["id"] for r in from_parquet] == [f"gsm8k-gsm-{i}" for i in range(1, 5)]
    path = tmp_path / "spaced.jsonl"
    path.write_text(json.dumps(GSM8K[0]) + "\n\n" + json.dumps(GSM8K[1]) + "\n")
    assert [r["id"] for r in read_source(path).rows] == ["gsm8k-spaced-1", "gsm8k-spaced-3"]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_calcx_rows_keep_their_fields_and_extra_columns(tmp_path, suffix):
    # the Calc-X release names the source column source_ds and adds result_float
    rows = [
        {k: v for k, v in r.items() if k != "source"} | {"source_ds": "ape210k", "result_float": float(r["result"])}
        for r in CALCX
    ]
    path = tmp_path / f"calcx{suffix}"
    write_jsonl(path, rows) if suffix == ".jsonl" else write_parquet(path, rows)
    result = read_source(path)
    assert not result.problems and len(result.rows) == 8
    assert result.rows[0]["source"] == "ape210k" and result.rows[3]["result_float"] == 8.0
    assert [r["id"] for r in result.rows] == [r["id"] for r in CALCX]


BAD_GSM8K = [
    ("{oops", None, "is not valid JSON"),
    (json.dumps({"answer": "1+1=2\n#### 2"}), "question", "is missing"),
    (json.dumps({"question": "  ", "answer": "#### 2"}), "question", "is empty"),
    (json.dumps({"question": "Q?", "answer": 2}), "answer", "must be a string, got int"),
    (json.dumps({"question": "Q?", "answer": "1+1=2, so 2"}), "answer", "has no '####'"),
    (json.dumps({"question": "Q?", "answer": "so\n#### two apples"}), "answer", "has 'two apples' after its last"),
    (json.dumps({"question": "Q?", "answer": "so\n####"}), "answer", "has nothing after its last '####'"),
    (json.dumps({"question": "Q?", "answer": "so\n#### 1,00"}), "answer", "has '1,00' after its last"),
    (json.dumps(["question", "answer"]), None, "expected an object with fields question, answer, got list"),
]


@pytest.mark.parametrize("line, field, reason", BAD_GSM8K)
def test_each_bad_gsm8k_row_is_named_by_file_line_and_field(tmp_path, line, field, reason):
    path = write_jsonl(tmp_path / "gsm.jsonl", GSM8K, raw_lines={3: line})
    result = read_source(path, "gsm8k")
    assert len(result.rows) == 4 and result.read == 5
    [problem] = result.problems
    assert (problem.file, problem.line, problem.field) == (str(path), 3, field)
    text = str(problem)
    assert text.startswith(f"{path}: line 3: ") and reason in text
    if field:
        assert f"field '{field}'" in text


@pytest.mark.parametrize(
    "change, field, reason",
    [
        ({"question": None}, "question", "is missing"),
        ({"result": " "}, "result", "is empty"),
        ({"chain": ["step"]}, "chain", "must be a string, got list"),
        ({"id": True}, "id", "must be a string, got a boolean"),
    ],
)
def test_each_bad_calcx_row_is_named_in_jsonl_and_parquet(tmp_path, change, field, reason):
    rows = [CALCX[0], {**CALCX[1], **change}, CALCX[2]]
    paths = [(write_jsonl(tmp_path / "c.jsonl", rows), "line")]
    if all(v is None or isinstance(v, str) for v in change.values()):  # a parquet column has one type
        paths.append((write_parquet(tmp_path / "c.parquet", rows), "row"))
    for path, unit in paths:
        [problem] = read_source(path).problems
        assert (problem.line, problem.field, problem.unit) == (2, field, unit)
        assert str(problem).startswith(f"{path}: {unit} 2: field '{field}' {reason}")


def test_a_parquet_column_of_the_wrong_type_names_every_row(tmp_path):
    path = write_parquet(tmp_path / "c.parquet", [{**r, "chain": [r["chain"]]} for r in CALCX[:3]])
    result = read_source(path)
    assert not result.rows
    assert [str(p) for p in result.problems] == [
        f"{path}: row {n}: field 'chain' must be a string, got list" for n in (1, 2, 3)
    ]


def test_a_repeated_id_is_a_bad_row_and_names_the_first(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", CALCX[:3])
    b = write_jsonl(tmp_path / "b.jsonl", [CALCX[3], CALCX[1]])
    result = import_files([a, b])
    [problem] = result.problems
    assert str(problem) == f"{b}: line 2: field 'id' repeats id 'ape-2' of {a}: line 2"
    assert len(result.rows) == 4


def test_split_is_disjoint_complete_seeded_and_order_free():
    rows = [{**CALCX[0], "id": f"r{i}"} for i in range(300)]
    train, val = split_rows(rows, 40, seed=3)
    train_ids, val_ids = {r["id"] for r in train}, {r["id"] for r in val}
    assert len(val) == 40 and not train_ids & val_ids and train_ids | val_ids == {r["id"] for r in rows}
    assert split_rows(list(reversed(rows)), 40, seed=3) == (train, val)
    assert {r["id"] for r in split_rows(rows, 40, seed=4)[1]} != val_ids


def test_split_needs_rows_left_to_train_on():
    with pytest.raises(ValueError, match=r"--val-size 8 leaves no training rows: only 8 good rows"):
        split_rows(CALCX, 8)
    with pytest.raises(ValueError, match=r"--val-size must be at least 1"):
        split_rows(CALCX, 0)


def run(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["data", "import", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_writes_the_generate_layout_with_a_summary(tmp_path, capsys):
    gsm = write_jsonl(tmp_path / "gsm.jsonl", GSM8K)
    calcx_rows = write_parquet(tmp_path / "calcx.parquet", CALCX)
    out = tmp_path / "out"
    code, stdout, stderr = run(
        capsys,
        str(gsm),
        str(calcx_rows),
        "--out",
        str(out),
        "--val-size",
        "3",
        "--mini-size",
        "2",
        "--sample-size",
        "4",
    )
    assert code == 0, stderr
    assert stdout.splitlines()[-1] == "imported 12 rows read from 2 files: 9 train, 3 validation, 0 skipped"
    train, val = read_rows(out / "train.parquet"), read_rows(out / "test.parquet")
    assert len(train) == 9 and len(val) == 3
    assert not {r["id"] for r in train} & {r["id"] for r in val}
    assert read_rows(out / "test_mini.parquet") == val[:2]
    assert read_rows(out / "sample.jsonl") == train[:4]
    assert {r["source"] for r in train + val} == {"gsm8k", "ape210k"}
    assert main(["data", "validate", *(str(out / n) for n in OUTPUTS)]) == 0


def test_cli_same_seed_gives_byte_identical_files(tmp_path, capsys):
    gsm = write_jsonl(tmp_path / "gsm.jsonl", GSM8K)
    calcx_rows = write_jsonl(tmp_path / "calcx.jsonl", CALCX)
    runs = {"a": (gsm, calcx_rows), "b": (calcx_rows, gsm)}  # input order does not matter either
    for name, inputs in runs.items():
        assert run(capsys, *map(str, inputs), "--out", str(tmp_path / name), "--val-size", "4", "--seed", "9")[0] == 0
    for file in OUTPUTS:
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes(), file
    assert (
        run(capsys, str(gsm), str(calcx_rows), "--out", str(tmp_path / "c"), "--val-size", "4", "--seed", "10")[0] == 0
    )
    assert (tmp_path / "a" / "test.parquet").read_bytes() != (tmp_path / "c" / "test.parquet").read_bytes()


def test_cli_refuses_bad_rows_and_writes_nothing(tmp_path, capsys):
    lines = {2 + 2 * i: json.dumps({"question": f"Q{i}?", "answer": "no mark"}) for i in range(24)}
    path = write_jsonl(tmp_path / "gsm.jsonl", GSM8K * 10, raw_lines=lines)
    out = tmp_path / "out"
    code, stdout, stderr = run(capsys, str(path), "--out", str(out), "--val-size", "5")
    assert code == 1 and not out.exists() and stdout == ""
    assert "24 bad rows in 64 read; nothing written" in stderr and "--skip-invalid" in stderr
    listed = [ln for ln in stderr.splitlines() if ln.startswith(f"  {path}: line ")]
    assert len(listed) == 20 and listed[0] == (
        f"  {path}: line 2: field 'answer' has no '####' line " "(a GSM8K answer ends with '#### <number>')"
    )
    assert stderr.splitlines()[-1] == "  ... and 4 more"


def test_cli_skip_invalid_writes_the_good_rows_and_says_what_it_skipped(tmp_path, capsys):
    path = write_jsonl(tmp_path / "gsm.jsonl", GSM8K, raw_lines={2: "{oops", 4: json.dumps({"question": "Q"})})
    out = tmp_path / "out"
    code, stdout, stderr = run(capsys, str(path), "--out", str(out), "--val-size", "1", "--skip-invalid")
    assert code == 0
    assert "skipped 2 bad rows" in stderr
    assert f"{path}: line 2: is not valid JSON" in stderr and f"{path}: line 4: field 'answer' is missing" in stderr
    assert stdout.splitlines()[-1] == "imported 6 rows read from 1 file: 3 train, 1 validation, 2 skipped"
    ids = {r["id"] for r in read_rows(out / "train.parquet") + read_rows(out / "test.parquet")}
    assert ids == {"gsm8k-gsm-1", "gsm8k-gsm-3", "gsm8k-gsm-5", "gsm8k-gsm-6"}


def test_the_default_validation_split_holds_out_1000_rows_by_id(tmp_path, capsys):
    rows = [
        {
            "question": f"Ana has {i} pens and buys 2. How many?",
            "answer": f"{i}+2=<<{i}+2={i + 2}>>{i + 2}\n#### {i + 2}",
        }
        for i in range(1100)
    ]
    out = tmp_path / "out"
    code, stdout, _ = run(capsys, str(write_jsonl(tmp_path / "gsm.jsonl", rows)), "--out", str(out))
    assert (
        code == 0
        and stdout.splitlines()[-1] == "imported 1100 rows read from 1 file: 100 train, 1000 validation, 0 skipped"
    )
    train, val = read_rows(out / "train.parquet"), read_rows(out / "test.parquet")
    assert len({r["id"] for r in train} | {r["id"] for r in val}) == 1100  # no id in both


def test_cli_usage_errors(tmp_path, capsys):
    gsm = write_jsonl(tmp_path / "gsm.jsonl", GSM8K)
    out = tmp_path / "out"
    assert run(capsys, str(gsm), "--out", str(out), "--val-size", "1")[0] == 0
    code, _, stderr = run(capsys, str(gsm), "--out", str(out), "--val-size", "1")
    assert code == 2 and "already exist; pass --force to overwrite" in stderr
    assert run(capsys, str(gsm), "--out", str(out), "--val-size", "2", "--force")[0] == 0
    code, _, stderr = run(capsys, str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o2"))
    assert code == 2 and "missing.jsonl: cannot open" in stderr
    code, _, stderr = run(capsys, str(gsm), "--out", str(tmp_path / "o3"), "--val-size", "4")
    assert code == 2 and "--val-size 4 leaves no training rows" in stderr and not (tmp_path / "o3").exists()


@pytest.mark.skipif(
    not REAL_GSM8K.is_file(),
    reason="needs GSM8K's train.jsonl, which the repository does not ship: set CALCX_GSM8K_FILE to a copy",
)
def test_the_real_gsm8k_train_file(tmp_path, capsys):
    code, stdout, stderr = run(capsys, str(REAL_GSM8K), "--out", str(tmp_path / "gsm8k"))
    assert code == 0, stderr
    assert stdout.splitlines()[-1] == "imported 7473 rows read from 1 file: 6473 train, 1000 validation, 0 skipped"
    train, val = read_rows(tmp_path / "gsm8k" / "train.parquet"), read_rows(tmp_path / "gsm8k" / "test.parquet")
    assert not {r["id"] for r in train} & {r["id"] for r in val}
    assert not {r["question"] for r in train} & {r["question"] for r in val}
    # the hard split of the held-out rows is made of held-out problems only
    hard = tmp_path / "gsm8k" / "test-hard.parquet"
    assert main(["data", "harden", str(tmp_path / "gsm8k" / "test.parquet"), "--out", str(hard)]) == 0
    hard_ids = {r["id"].removesuffix("-hard") for r in read_rows(hard)}
    assert len(hard_ids) > 400 and hard_ids <= {r["id"] for r in val}
    rows = train + val
    assert all(re.fullmatch(r"-?\d+(\.\d+)?", r["result"]) for r in rows)
    assert all("####" not in r["chain"] and r["chain"] for r in rows)
