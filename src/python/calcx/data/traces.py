"""GSM8K calculator annotations -> chat traces in the agent's own format, for a supervised warm-up.

GSM8K's answers mark each computation as `48/2 = <<48/2=24>>24`: an expression and its result.
A trace is the conversation calcx's agent has when it uses the calculator for all of them:

1. system and user messages exactly as the agent sends them (`calcx.agent.answer.prompt_messages`);
2. one assistant turn calling the `calculate` tool once per annotation, in order (AutoGen's
   AssistantAgent makes one round of tool calls, then reflects: `reflect_on_tool_use`);
3. one `tool` message per call holding what the MCP calculator answers for the expression (its own
   server code, in-process: `calcx.anchor.calculator`);
4. the closing assistant turn: GSM8K's reasoning with the annotations removed, then the answer in
   the agent's format (`### ANSWER: 72 ###`).

Every row comes with `tools`, the `calculate` entry the agent's requests carry, so a chat template
renders the trace as it renders the agent's calls. A row whose annotations cannot make a faithful
trace (unclosed, no result, an expression the calculator refuses or one that could run away, a
result the calculator does not reproduce, no annotation at all) is skipped and named by row.
"""

from __future__ import annotations

import ast
import asyncio
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from calcx.agent.answer import format_answer, prompt_messages
from calcx.anchor.calculator import calculator_tool_entry, call
from calcx.data.schema import DataError

ANNOTATION_RE = re.compile(r"<<([^<>]*)>>")
TRACE_SUFFIXES = (".parquet", ".jsonl")
# bounds on what is sent to the calculator: its evaluator has no limits of its own (`9**9**9`
# would run for ever), so an annotation past these is skipped, not evaluated
MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_CALLS_PER_ROW = 32


@dataclass(frozen=True)
class Skipped:
    """A row left out: where it came from and why."""

    where: str
    reason: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}" + (f" ({self.detail})" if self.detail else "")


@dataclass
class TraceResult:
    traces: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    calls: int = 0  # calculator calls in the kept traces


class TraceError(ValueError):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def annotation_pairs(chain: str) -> list[tuple[str, str]]:
    """(expression, result) of every `<<expression=result>>` in order; TraceError when a mark is
    broken or there is none."""
    found = ANNOTATION_RE.findall(chain)
    leftover = ANNOTATION_RE.sub("", chain)
    if "<<" in leftover or ">>" in leftover:
        raise TraceError("unclosed_annotation", "a '<<' without its '>>' (or the reverse)")
    if not found:
        raise TraceError("no_annotation", "the answer has no <<expression=result>> mark")
    if len(found) > MAX_CALLS_PER_ROW:
        raise TraceError("too_many_annotations", f"{len(found)} > {MAX_CALLS_PER_ROW}")
    pairs = []
    for mark in found:
        expression, sep, result = mark.rpartition("=")
        if not sep or not expression.strip() or not result.strip():
            raise TraceError("no_result", f"<<{mark}>> is not expression=result")
        pairs.append((expression.strip(), result.strip()))
    return pairs


def check_bounded(expression: str) -> None:
    """TraceError unless the expression is short arithmetic whose powers cannot explode (read with
    the calculator's own substitutions: `^` is a power)."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise TraceError("expression_too_long", f"{len(expression)} > {MAX_EXPRESSION_CHARS} characters")
    text = expression.replace("^", "**").replace("×", "*").replace("÷", "/")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise TraceError("bad_expression", f"{expression!r}: {exc.msg}") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            exponent = node.right
            value = exponent.value if isinstance(exponent, ast.Constant) else None
            if not isinstance(value, (int, float)) or isinstance(value, bool) or abs(value) > MAX_EXPONENT:
                raise TraceError("unbounded_power", f"{expression!r}: exponents must be numbers up to {MAX_EXPONENT}")


def _number(text: str) -> float | None:
    try:
        value = float(text.replace(",", "").rstrip("."))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def same_result(annotated: str, calculated: str) -> bool:
    """The annotation's result is the calculator's, up to the digits the annotation shows
    (GSM8K writes `<<10/3=3.33>>` for 3.3333333333333335)."""
    want, got = _number(annotated), _number(calculated)
    if want is None or got is None:
        return False
    shown = annotated.replace(",", "").rstrip(".")
    decimals = len(shown.split(".", 1)[1]) if "." in shown else 0
    return abs(want - got) <= 0.5 * 10 ** -decimals + 1e-9 * max(1.0, abs(got))


def reasoning(chain: str) -> str:
    """GSM8K's reasoning as the closing turn shows it: the marks removed, the values kept."""
    return ANNOTATION_RE.sub("", chain).strip()


async def build_trace(row: dict[str, Any], tools: list[dict[str, Any]]) -> tuple[dict[str, Any], int]:
    """(trace row, calculator calls) for one imported GSM8K row, or TraceError."""
    pairs = annotation_pairs(str(row["chain"]))
    tool_calls, answers = [], []
    for index, (expression, annotated) in enumerate(pairs):
        check_bounded(expression)
        text, is_error = await call("calculate", {"expression": expression})
        if is_error:
            raise TraceError("calculator_error", f"<<{expression}={annotated}>>: {text}")
        if not same_result(annotated, text):
            raise TraceError("result_mismatch", f"<<{expression}={annotated}>>: the calculator answers {text}")
        call_id = f"call_{index}"
        tool_calls.append({"id": call_id, "type": "function",
                           "function": {"name": "calculate", "arguments": json.dumps({"expression": expression})}})
        answers.append({"role": "tool", "tool_call_id": call_id, "content": text})
    closing = f"{reasoning(str(row['chain']))}\n\n{format_answer(str(row['result']))}"
    messages = [*prompt_messages(str(row["question"])),
                {"role": "assistant", "content": None, "tool_calls": tool_calls},
                *answers,
                {"role": "assistant", "content": closing}]
    return {"id": row["id"], "source": row.get("source", "gsm8k"), "messages": messages, "tools": tools}, len(pairs)


def build_traces(rows: Sequence[dict[str, Any]], origins: Sequence[str]) -> TraceResult:
    """Traces of the rows (imported by `calcx.data.importers`), each skip named by its origin."""
    tools = [calculator_tool_entry()]

    async def run() -> TraceResult:
        result = TraceResult()
        for row, where in zip(rows, origins):
            try:
                trace, calls = await build_trace(row, tools)
            except TraceError as exc:
                result.skipped.append(Skipped(where, exc.reason, exc.detail))
                continue
            result.traces.append(trace)
            result.calls += calls
        return result

    return asyncio.run(run())


def write_traces(traces: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> Path:
    """`.jsonl` (one trace a line) or `.parquet` (columns id, source, messages, tools: what verl's
    multi-turn SFT dataset reads), written to a temporary file and renamed."""
    import tempfile

    out = Path(path)
    if out.suffix not in TRACE_SUFFIXES:
        raise DataError(f"{out}: unknown file type; expected one of {', '.join(TRACE_SUFFIXES)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    try:
        if out.suffix == ".jsonl":
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                for trace in traces:
                    handle.write(json.dumps(trace, ensure_ascii=False) + "\n")
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            os.close(fd)
            pq.write_table(pa.Table.from_pylist(list(traces)), tmp)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out
