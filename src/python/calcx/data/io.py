"""Reading and writing Calc-X rows as parquet (pyarrow) or JSON lines, validated row by row."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from calcx.data.schema import FIELDS, DataError, validate_row

SUFFIXES = (".parquet", ".jsonl")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    rows = []
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise DataError(f"{path}: cannot open: {exc.strerror or exc}") from None
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}: row {number}: not valid JSON ({exc.msg} at column {exc.colno})") from None
            rows.append(validate_row(row, file=str(path), number=number))
    return rows


def read_parquet_records(path: str | Path) -> tuple[list[str], list[dict[str, Any]]]:
    """A parquet file's column names and raw rows, unvalidated; DataError if missing or damaged."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise DataError(f"{path}: not a readable parquet file ({exc})") from None
    return table.column_names, table.to_pylist()


def read_parquet(path: str | Path) -> list[dict[str, Any]]:
    _, records = read_parquet_records(path)
    return [validate_row(row, file=str(path), number=i) for i, row in enumerate(records, start=1)]


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a ``.parquet`` or ``.jsonl`` file, each validated (DataError names file/row/field)."""
    path = Path(path)
    if path.suffix == ".parquet":
        return read_parquet(path)
    if path.suffix in (".jsonl", ".json"):
        return read_jsonl(path)
    raise DataError(f"{path}: unknown file type; expected one of {', '.join(SUFFIXES)}")


def _write_atomically(path: Path, write: Callable[[str], None]) -> None:
    """`write(tmp)` fills a temporary file beside `path`, which then replaces `path` in one step:
    a reader never sees half a file, and a failed write leaves the old file and no temporary."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_jsonl(rows: Iterable[dict[str, Any]], path: str | Path) -> Path:
    """Validate and write rows as JSON lines (written to a temporary file, then renamed)."""
    path = Path(path)
    checked = [validate_row(row, file=str(path), number=i) for i, row in enumerate(rows, start=1)]

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as handle:
            for row in checked:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")

    _write_atomically(path, write)
    return path


def write_parquet(rows: Iterable[dict[str, Any]], path: str | Path) -> Path:
    """Validate and write rows as parquet, the five Calc-X columns first."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    checked = [validate_row(row, file=str(path), number=i) for i, row in enumerate(rows, start=1)]
    extra = sorted({key for row in checked for key in row} - set(FIELDS))
    columns = list(FIELDS) + extra
    table = pa.table({name: [row.get(name) for row in checked] for name in columns})
    _write_atomically(path, lambda tmp: pq.write_table(table, tmp))
    return path


def write_rows(rows: Iterable[dict[str, Any]], path: str | Path) -> Path:
    path = Path(path)
    if path.suffix == ".parquet":
        return write_parquet(rows, path)
    if path.suffix == ".jsonl":
        return write_jsonl(rows, path)
    raise DataError(f"{path}: unknown file type; expected one of {', '.join(SUFFIXES)}")
