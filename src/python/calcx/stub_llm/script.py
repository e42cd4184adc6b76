"""What the stub model "thinks": the expression to hand the calculator for a question.

A script maps questions to expressions (from a Calc-X row's chain: the last
calculator gadget, whose operands are already the intermediate results). Without
a script entry, the stub looks for arithmetic written in the question itself
("What is 12 * (3 + 4)?").
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

MARKER_RE = re.compile(r"\[stub:([a-z0-9_]+)(?:=([0-9]+(?:\.[0-9]+)?))?\]", re.IGNORECASE)
GADGET_RE = re.compile(r'<gadget id="calculator">(.*?)</gadget>', re.DOTALL)
_ARITHMETIC_RE = re.compile(r"[-+(]*\s*[\d.][\d.,_]*(?:\s*(?:\*\*|[-+*/^×÷])\s*[-+(]*\s*[\d.][\d.,_]*\s*\)*)+\)*")


class ScriptError(ValueError):
    """A script file or row the stub cannot use."""


def strip_markers(text: str) -> str:
    return " ".join(MARKER_RE.sub(" ", text).split())


def chain_expression(chain: str) -> str | None:
    """The last calculator expression in a Calc-X chain."""
    found = GADGET_RE.findall(chain or "")
    return found[-1].strip() if found else None


def arithmetic_in(text: str) -> str | None:
    """The longest arithmetic expression written in ``text`` (at least one operator)."""
    best = None
    for match in _ARITHMETIC_RE.finditer(strip_markers(text)):
        candidate = _balance(match.group(0).strip().rstrip(".,"))
        if candidate and (best is None or len(candidate) > len(best)):
            best = candidate
    return best


def _balance(expr: str) -> str:
    """Drop unmatched parentheses at the ends (sentence punctuation around a formula)."""
    while expr.startswith("(") and expr.count("(") > expr.count(")"):
        expr = expr[1:].strip()
    while expr.endswith(")") and expr.count(")") > expr.count("("):
        expr = expr[:-1].strip()
    return expr


class Script:
    """Question -> expression table, looked up by the question text the agent sends."""

    def __init__(self, entries: Mapping[str, str] | None = None) -> None:
        self._entries: dict[str, str] = {}
        for question, expression in (entries or {}).items():
            self.add(question, expression)

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, question: str, expression: str) -> None:
        key = strip_markers(question)
        if not key or not expression.strip():
            raise ScriptError("script entries need a non-empty question and expression")
        self._entries[key] = expression.strip()

    def add_rows(self, rows: Iterable[Mapping[str, object]], source: str = "<rows>") -> None:
        for number, row in enumerate(rows, start=1):
            question = row.get("question")
            expression = row.get("expression")
            if not expression and row.get("chain"):
                expression = chain_expression(str(row["chain"]))
            if not isinstance(question, str) or not question.strip():
                raise ScriptError(f"{source}: row {number}: field 'question' is missing or empty")
            if not isinstance(expression, str) or not expression.strip():
                raise ScriptError(
                    f"{source}: row {number}: needs an 'expression' or a 'chain' with a calculator gadget"
                )
            self.add(question, expression)

    def lookup(self, prompt: str) -> str | None:
        """The expression for the question inside ``prompt`` (the user's message)."""
        if not self._entries:
            return None
        text = strip_markers(prompt)
        if text in self._entries:
            return self._entries[text]
        for paragraph in re.split(r"\n\s*\n", prompt):
            key = strip_markers(paragraph)
            if key in self._entries:
                return self._entries[key]
        for question, expression in self._entries.items():
            if question in text:
                return expression
        return None

    def expression_for(self, prompt: str) -> str | None:
        return self.lookup(prompt) or arithmetic_in(prompt)


def load_script(paths: Iterable[str | Path]) -> Script:
    """Read script files: ``.jsonl`` (question + expression or chain) or Calc-X ``.parquet``."""
    script = Script()
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise ScriptError(f"script file {path} does not exist")
        if path.suffix == ".parquet":
            from calcx.data.io import read_rows

            script.add_rows(read_rows(path), source=str(path))
        elif path.suffix in (".jsonl", ".json"):
            rows = []
            with path.open(encoding="utf-8") as handle:
                for number, line in enumerate(handle, start=1):
                    if not line.strip():
                        continue
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise ScriptError(f"{path}: line {number}: not valid JSON ({exc})") from None
            script.add_rows(rows, source=str(path))
        else:
            raise ScriptError(f"script file {path}: expected .jsonl or .parquet")
    return script
