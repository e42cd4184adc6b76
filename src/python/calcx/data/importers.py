"""Import datasets made elsewhere (GSM8K, the Calc-X release) into calcx's dataset files.

A bad row found mid-training costs a GPU hour, so an import reads every input first and
collects every bad row by file, line and field; the caller then refuses (the default) or keeps
the good rows. The train/validation split is a seeded hash of each row's id, not of its
position: the same rows and seed give the same split and byte-identical files whatever order
the inputs came in, and no row can land in both splits.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calcx.data.io import read_parquet_records, write_jsonl, write_parquet
from calcx.data.schema import DataError, validate_row

FORMATS = ("auto", "gsm8k", "calcx")
GSM8K_FIELDS = ("question", "answer")
GSM8K_MARK = "####"
# An integer or decimal, optionally with thousands separators: 72, -3, 0.5, 1,000, 2,520,000.5
NUMBER_RE = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
# The files `calcx data generate` writes; test.parquet is the validation split (--val-file).
TRAIN, VALIDATION, MINI, SAMPLE = "train.parquet", "test.parquet", "test_mini.parquet", "sample.jsonl"
OUTPUT_FILES = (TRAIN, VALIDATION, MINI, SAMPLE)


@dataclass(frozen=True)
class Problem:
    """One bad row: where it is (file, 1-based line or parquet row, field) and what is wrong."""

    file: str
    line: int
    field: str | None
    reason: str
    unit: str = "line"  # "line" in a jsonl file, "row" in a parquet file

    def __str__(self) -> str:
        where = f"{self.file}: {self.unit} {self.line}"
        return f"{where}: field '{self.field}' {self.reason}" if self.field else f"{where}: {self.reason}"


@dataclass
class ImportResult:
    rows: list[dict[str, Any]] = field(default_factory=list)  # the good rows, in input order
    origins: list[Problem] = field(default_factory=list)  # where each good row came from (no field, reason "")
    read: int = 0  # rows read (non-blank jsonl lines, parquet rows), good or bad
    problems: list[Problem] = field(default_factory=list)


def _jsonl_records(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object or Problem) for every non-blank line."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise DataError(f"{path}: cannot open: {exc.strerror or exc}") from None
    with handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield number, Problem(str(path), number, None, f"is not UTF-8 text (byte {exc.start + 1})")
                continue
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                yield number, Problem(str(path), number, None, f"is not valid JSON ({exc.msg} at column {exc.colno})")


def _detect(keys: Any) -> str:
    """GSM8K rows have ``answer`` and no ``result``; anything else is read as Calc-X."""
    keys = set(keys) if isinstance(keys, Mapping | list) else set()
    return "gsm8k" if "answer" in keys and "result" not in keys else "calcx"


def gsm8k_row(record: Any, *, file: str, stem: str, number: int) -> dict[str, Any]:
    """A Calc-X row from one GSM8K ``{"question", "answer"}`` object, or DataError naming the field."""
    where = f"{file}: line {number}"
    if not isinstance(record, Mapping):
        reason = f"expected an object with fields question, answer, got {type(record).__name__}"
        raise DataError(f"{where}: {reason}", reason=reason)

    def fail(name: str, reason: str) -> DataError:
        return DataError(f"{where}: field '{name}' {reason}", field=name, reason=reason)

    for name in GSM8K_FIELDS:
        value = record.get(name)
        if value is None:
            raise fail(name, "is missing (every GSM8K row needs question, answer)")
        if not isinstance(value, str):
            raise fail(name, f"must be a string, got {type(value).__name__}")
        if not value.strip():
            raise fail(name, "is empty")
    rationale, mark, final = record["answer"].rpartition(GSM8K_MARK)
    if not mark:
        raise fail("answer", f"has no '{GSM8K_MARK}' line (a GSM8K answer ends with '{GSM8K_MARK} <number>')")
    final = final.strip()
    if not NUMBER_RE.fullmatch(final):
        shown = repr(final) if final else "nothing"
        raise fail("answer", f"has {shown} after its last '{GSM8K_MARK}'; expected a number such as 72 or 1,000")
    row = {
        "id": f"gsm8k-{stem}-{number}",
        "question": record["question"],
        "chain": rationale.strip(),
        "result": final.replace(",", ""),
        "source": "gsm8k",
    }
    return validate_row(row, file=file, number=number)


def _problem(exc: DataError, file: str, number: int, unit: str) -> Problem:
    return Problem(file, number, exc.field, exc.reason, unit)


def read_source(path: str | Path, fmt: str = "auto") -> ImportResult:
    """Rows of one ``.jsonl`` or ``.parquet`` file in GSM8K or Calc-X layout, with its bad rows.

    A file that cannot be read at all (missing, unknown type, damaged parquet) raises DataError.
    """
    if fmt not in FORMATS:
        raise DataError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    path = Path(path)
    file = str(path)
    columns: Iterable[str]  # parquet column names, or the keys of the first JSON object
    if path.suffix == ".parquet":
        columns, records = read_parquet_records(path)
        numbered: list[tuple[int, Any]] = list(enumerate(records, start=1))
        unit = "row"
    elif path.suffix == ".jsonl":
        numbered = list(_jsonl_records(path))
        columns = next((r for _, r in numbered if isinstance(r, Mapping)), {})
        unit = "line"
    else:
        raise DataError(f"{path}: unknown file type; expected .jsonl or .parquet")
    layout = _detect(columns) if fmt == "auto" else fmt
    result = ImportResult(read=len(numbered))
    for number, record in numbered:
        if isinstance(record, Problem):
            result.problems.append(record)
            continue
        try:
            if layout == "gsm8k":
                row = gsm8k_row(record, file=file, stem=path.stem, number=number)
            else:
                row = validate_row(record, file=file, number=number)
        except DataError as exc:
            result.problems.append(_problem(exc, file, number, unit))
            continue
        result.rows.append(row)
        result.origins.append(Problem(file, number, None, "", unit))
    return result


def import_files(paths: list[str | Path], fmt: str = "auto") -> ImportResult:
    """Every input's rows; a row whose id an earlier row already has is a problem too."""
    total = ImportResult()
    seen: dict[str, str] = {}
    for path in paths:
        part = read_source(path, fmt)
        total.read += part.read
        problems = list(part.problems)
        for row, origin in zip(part.rows, part.origins):
            first = seen.get(row["id"])
            if first is not None:
                reason = f"repeats id {row['id']!r} of {first}"
                problems.append(Problem(origin.file, origin.line, "id", reason, origin.unit))
                continue
            seen[row["id"]] = f"{origin.file}: {origin.unit} {origin.line}"
            total.rows.append(row)
            total.origins.append(origin)
        total.problems.extend(sorted(problems, key=lambda p: p.line))
    return total


def split_rows(
    rows: list[dict[str, Any]], val_size: int, seed: int = 0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, validation): rows ordered by sha256(seed, id); the first ``val_size`` validate.

    Ids must be unique (``import_files`` makes sure). Both splits come out in that hashed order,
    so the head of either (test_mini, sample.jsonl) is a random draw too.
    """
    if val_size < 1:
        raise DataError(f"--val-size must be at least 1 (the trainer needs a validation file), got {val_size}")
    if val_size >= len(rows):
        raise DataError(
            f"--val-size {val_size} leaves no training rows: only {len(rows)} good rows were read; "
            "pass a smaller --val-size"
        )
    ordered = sorted(rows, key=lambda r: hashlib.sha256(f"{seed}\0{r['id']}".encode()).hexdigest())
    return ordered[val_size:], ordered[:val_size]


def output_paths(out: str | Path) -> list[Path]:
    return [Path(out) / name for name in OUTPUT_FILES]


def write_dataset(
    train: list[dict[str, Any]],
    validation: list[dict[str, Any]],
    out: str | Path,
    *,
    mini_size: int = 50,
    sample_size: int = 16,
) -> list[tuple[Path, int]]:
    """Write the files `calcx data generate` writes; test_mini and sample are heads of the splits."""
    train_path, val_path, mini_path, sample_path = output_paths(out)
    mini, sample = validation[:mini_size], train[:sample_size]
    write_parquet(train, train_path)
    write_parquet(validation, val_path)
    write_parquet(mini, mini_path)
    write_jsonl(sample, sample_path)
    return [(train_path, len(train)), (val_path, len(validation)), (mini_path, len(mini)), (sample_path, len(sample))]
