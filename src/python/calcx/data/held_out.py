"""The rows held out of training: those of the validation files, known by id and by question text.

A warm-up trace or a training row of a held-out problem would let the validation set leak into what
the model learns, so every command that writes training material (`calcx data traces`, `calcx runs
traces`) leaves out a row whose id, or whose question (whitespace folded), is in one of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calcx.data.io import read_rows


def _folded(question: object) -> str:
    return " ".join(str(question or "").split())


@dataclass(frozen=True)
class HeldOut:
    """The ids and folded question texts of the held-out rows."""

    ids: frozenset[str] = frozenset()
    questions: frozenset[str] = frozenset()

    @classmethod
    def read(cls, paths: Iterable[str | Path]) -> HeldOut:
        """The rows of `paths` (any file `read_rows` reads; DataError or OSError for a bad one)."""
        ids: set[str] = set()
        questions: set[str] = set()
        for path in paths:
            for row in read_rows(path):
                ids.add(str(row.get("id", "")))
                questions.add(_folded(row.get("question")))
        questions.discard("")
        return cls(frozenset(ids), frozenset(questions))

    def holds(self, row: Mapping[str, Any]) -> bool:
        """Whether `row` is a held-out problem: its id or its question text is one of theirs."""
        return str(row.get("id")) in self.ids or _folded(row.get("question")) in self.questions
