"""The Calc-X row: ``id``, ``question``, ``chain``, ``result``, ``source``.

Rows are plain dicts (that is what travels to the server as a rollout's row).
Validation names the file, the row number (1-based) and the field, and says what
is expected, so a bad dataset is fixed in one go rather than found mid-training.
Columns beyond the five are kept as they are, but ``rel_tol`` (a row's own reward tolerance) is
checked: a number from 0 up to 1, or null for Calc-X's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from calcx.contract.env import REL_TOL_FIELD, parse_rel_tol

FIELDS = ("id", "question", "chain", "result", "source")
NON_EMPTY_FIELDS = ("id", "question", "result")
# Calc-X's own files name the source column ``source_ds``; it is accepted as ``source``.
FIELD_ALIASES = {"source_ds": "source"}


class DataError(ValueError):
    """A dataset file or row that does not follow the Calc-X schema.

    ``field`` and ``reason`` (the message without its ``file: row N:`` prefix) are set when one
    field of one row is at fault, so an importer can list problems by file, line and field.
    """

    def __init__(self, message: str, *, field: str | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.reason = reason if reason is not None else message


def _field_error(where: str, field: str, reason: str) -> DataError:
    return DataError(f"{where}: field '{field}' {reason}", field=field, reason=reason)


def _as_text(value: Any, field: str, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        raise _field_error(where, field, "must be a string, got a boolean")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and field in ("id", "result"):
        if not math.isfinite(value):
            raise _field_error(where, field, f"must be a finite number or a string, got {value!r}")
        return str(int(value)) if value.is_integer() else repr(value)
    raise _field_error(where, field, f"must be a string, got {type(value).__name__}")


def validate_row(row: Any, *, file: str = "<rows>", number: int = 0) -> dict[str, Any]:
    """A clean copy of ``row`` (numbers in ``id``/``result`` become strings) or DataError."""
    where = f"{file}: row {number}"
    if not isinstance(row, Mapping):
        reason = f"expected an object with fields {', '.join(FIELDS)}, got {type(row).__name__}"
        raise DataError(f"{where}: {reason}", reason=reason)
    clean: dict[str, Any] = {}
    for key, value in row.items():
        key = str(key)
        alias = FIELD_ALIASES.get(key)
        clean[alias if alias is not None and alias not in row else key] = value
    for field in FIELDS:
        if field not in clean or clean[field] is None:
            raise _field_error(where, field, f"is missing (every row needs {', '.join(FIELDS)})")
        clean[field] = _as_text(clean[field], field, where)
    for field in NON_EMPTY_FIELDS:
        if not clean[field].strip():
            raise _field_error(where, field, "is empty")
    if REL_TOL_FIELD in clean:  # the row's own tolerance (the hard split's); null: Calc-X's
        if clean[REL_TOL_FIELD] is None:
            del clean[REL_TOL_FIELD]
        else:
            try:
                clean[REL_TOL_FIELD] = parse_rel_tol(clean[REL_TOL_FIELD], what="")
            except ValueError as exc:
                raise _field_error(where, REL_TOL_FIELD, str(exc).strip()) from None
    return clean
