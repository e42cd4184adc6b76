"""Calc-X rows: schema validation, parquet/jsonl round trips, clear errors."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from calcx.data.io import read_rows, write_jsonl, write_parquet, write_rows
from calcx.data.schema import DataError, validate_row

ROW = {
    "id": "r1",
    "question": "What is 2 + 2?",
    "chain": '<gadget id="calculator">2 + 2</gadget>\n<output>4</output>',
    "result": "4",
    "source": "mawps",
}


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_round_trip_keeps_rows_and_extra_columns(tmp_path, suffix):
    rows: list[dict[str, Any]] = [ROW, {**ROW, "id": "r2", "result_float": 4.0}]
    path = write_rows(rows, tmp_path / f"rows{suffix}")
    back = read_rows(path)
    assert back[0]["question"] == ROW["question"] and back[1]["result_float"] == 4.0
    assert [r["id"] for r in back] == ["r1", "r2"]


def test_parquet_columns_start_with_the_calcx_fields(tmp_path):
    path = write_parquet([{**ROW, "zeta": "z"}], tmp_path / "t.parquet")
    assert pq.read_table(path).column_names == ["id", "question", "chain", "result", "source", "zeta"]


def test_numbers_in_id_and_result_become_strings():
    row = validate_row({**ROW, "id": 7, "result": 2.5})
    assert row["id"] == "7" and row["result"] == "2.5"
    assert validate_row({**ROW, "result": 3.0})["result"] == "3"


def test_a_rows_tolerance_is_read_as_a_number_and_a_null_one_as_none(tmp_path):
    """The hard split's rows carry rel_tol; a parquet file mixing them with GSM8K's holds null there,
    which means Calc-X's tolerance: the field is left out, so the row travels as a GSM8K row does."""
    assert validate_row({**ROW, "rel_tol": "1e-9"})["rel_tol"] == 1e-9
    path = write_parquet([{**ROW, "rel_tol": 1e-9}, {**ROW, "id": "r2"}], tmp_path / "mixed.parquet")
    assert pq.read_table(path).column("rel_tol").to_pylist() == [1e-9, None]
    hard, plain = read_rows(path)
    assert hard["rel_tol"] == 1e-9 and "rel_tol" not in plain


def test_source_ds_column_is_read_as_source():
    row = {k: v for k, v in ROW.items() if k != "source"} | {"source_ds": "gsm8k"}
    assert validate_row(row)["source"] == "gsm8k"


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"question": None}, "field 'question' is missing"),
        ({"result": "  "}, "field 'result' is empty"),
        ({"chain": ["x"]}, "field 'chain' must be a string"),
        ({"result": float("nan")}, "field 'result' must be a finite number"),
        ({"id": True}, "field 'id' must be a string"),
        ({"rel_tol": "1%"}, "field 'rel_tol' must be a relative tolerance from 0 (exact) up to 1, got '1%'"),
        ({"rel_tol": 1.5}, "field 'rel_tol' must be a relative tolerance"),
    ],
)
def test_bad_row_errors_name_file_row_and_field(tmp_path, change, fragment):
    path = tmp_path / "bad.jsonl"
    rows = [ROW, {**ROW, **change}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(DataError) as info:
        read_rows(path)
    assert str(path) in str(info.value) and "row 2" in str(info.value) and fragment in str(info.value)


def test_missing_field_in_parquet_names_row(tmp_path):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"id": ["a"], "question": ["q"], "chain": ["c"], "result": ["1"]}), path)
    with pytest.raises(DataError, match=r"bad.parquet: row 1: field 'source' is missing"):
        read_rows(path)


def test_invalid_json_line_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROW) + "\n\n{oops\n")
    with pytest.raises(DataError, match=r"row 3: not valid JSON"):
        read_rows(path)


def test_not_a_parquet_file(tmp_path):
    path = tmp_path / "fake.parquet"
    path.write_text("hello")
    with pytest.raises(DataError, match="not a readable parquet file"):
        read_rows(path)


def test_unknown_suffix_and_missing_file(tmp_path):
    with pytest.raises(DataError, match="unknown file type"):
        read_rows(tmp_path / "rows.csv")
    with pytest.raises(DataError, match="no such file"):
        read_rows(tmp_path / "none.parquet")


def test_invalid_rows_are_not_written(tmp_path):
    target = tmp_path / "out.jsonl"
    with pytest.raises(DataError, match="row 2"):
        write_jsonl([ROW, {"id": "x"}], target)
    assert not target.exists() and list(tmp_path.iterdir()) == []


# a value each writer takes past validation but cannot write: json has no object(), parquet no
# struct without fields
UNWRITABLE = {".jsonl": object(), ".parquet": {}}


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, suffix):
    path = write_rows([ROW], tmp_path / f"rows{suffix}")
    before = path.read_bytes()
    with pytest.raises(Exception):  # noqa: B017 - json's TypeError, pyarrow's ArrowNotImplementedError
        write_rows([{**ROW, "id": "r2"}, {**ROW, "id": "r3", "extra": UNWRITABLE[suffix]}], path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
