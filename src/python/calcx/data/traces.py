"""GSM8K calculator annotations -> chat traces in the agent's own format, for a supervised warm-up.

GSM8K's answers mark each computation as `48/2 = <<48/2=24>>24`: an expression and its result.
A trace is the conversation calcx's agent has when it uses the calculator for all of them:

1. system and user messages exactly as the agent sends them (`calcx.agent.answer.prompt_messages`);
2. one assistant turn calling the `calculate` tool once per annotation, in order (an agent of one
   tool round, `calcx.agent_tool_rounds: 1`, makes all its calls at once, then answers);
3. one `tool` message per call holding what the MCP calculator answers for the expression (its own
   server code, in-process: `calcx.agent.calculator_inprocess`);
4. the closing assistant turn: GSM8K's reasoning with the annotations removed, then the answer in
   the agent's format (`### ANSWER: 72 ###`).

For an agent of N > 1 tool rounds (`tool_rounds=N`) a trace is sequential: each annotation is its
own assistant turn with one call, answered by its tool message before the next turn, so an
expression may use what an earlier call returned. GSM8K writes the result right after its mark
(`48/2 = <<48/2=24>>24 clips`), so the reasoning is cut at the marks, not at line ends: a turn
holds the text from the last mark's result up to its own mark (`24 clips.\nIn all 48+24 =`), the
closing turn the text after the last mark and the answer; a line's whole text before its call would
state the result the call has not returned yet. Joined, the turns' texts are the reasoning. A row
with more annotations than N rounds is skipped (`too_many_rounds`): the agent could not follow it.

Every row comes with `tools`, the `calculate` entry the agent's requests carry, so a chat template
renders the trace as it renders the agent's calls. A row whose annotations cannot make a faithful
trace (unclosed, no result, an expression the calculator refuses or one that could run away, a
result the calculator does not reproduce, no annotation at all) is skipped and named by row.
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calcx.agent.answer import format_answer, prompt_messages
from calcx.agent.calculator_inprocess import calculator_tool_entry, call
from calcx.contract.chain import ANNOTATION_RE, annotation_marks, parse_number
from calcx.contract.env import TOOL_ROUNDS_DEFAULT
from calcx.data.schema import DataError

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
    for mark, pair in zip(found, annotation_marks(chain)):
        if pair is None:
            raise TraceError("no_result", f"<<{mark}>> is not expression=result")
        pairs.append(pair)
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
            if not isinstance(value, int | float) or isinstance(value, bool) or abs(value) > MAX_EXPONENT:
                raise TraceError("unbounded_power", f"{expression!r}: exponents must be numbers up to {MAX_EXPONENT}")


def same_result(annotated: str, calculated: str) -> bool:
    """The annotation's result is the calculator's, up to the digits the annotation shows
    (GSM8K writes `<<10/3=3.33>>` for 3.3333333333333335)."""
    want, got = parse_number(annotated), parse_number(calculated)
    if want is None or got is None:
        return False
    shown = annotated.replace(",", "").rstrip(".")
    decimals = len(shown.split(".", 1)[1]) if "." in shown else 0
    return abs(want - got) <= 0.5 * 10**-decimals + 1e-9 * max(1.0, abs(got))


def reasoning(chain: str) -> str:
    """GSM8K's reasoning as the closing turn shows it: the marks removed, the values kept."""
    return ANNOTATION_RE.sub("", chain).strip()


def _tool_call(index: int, expression: str) -> dict[str, Any]:
    return {
        "id": f"call_{index}",
        "type": "function",
        "function": {"name": "calculate", "arguments": json.dumps({"expression": expression})},
    }


async def _calculated(pairs: list[tuple[str, str]]) -> list[str]:
    """What the calculator answers for each annotation; TraceError unless it reproduces them all."""
    answers = []
    for expression, annotated in pairs:
        check_bounded(expression)
        text, is_error = await call("calculate", {"expression": expression})
        if is_error:
            raise TraceError("calculator_error", f"<<{expression}={annotated}>>: {text}")
        if not same_result(annotated, text):
            raise TraceError("result_mismatch", f"<<{expression}={annotated}>>: the calculator answers {text}")
        answers.append(text)
    return answers


def turn_texts(chain: str) -> list[str]:
    """The reasoning cut at the marks: the text before each mark, then the text after the last."""
    return [part.strip() for part in ANNOTATION_RE.split(chain)[0::2]]


async def build_trace(
    row: dict[str, Any], tools: list[dict[str, Any]], tool_rounds: int = TOOL_ROUNDS_DEFAULT
) -> tuple[dict[str, Any], int]:
    """(trace row, calculator calls) for one imported GSM8K row, or TraceError: one round of all
    the calls (`tool_rounds` 1), else one call a turn (module docstring)."""
    chain, answer = str(row["chain"]), format_answer(str(row["result"]))
    pairs = annotation_pairs(chain)
    if tool_rounds > 1 and len(pairs) > tool_rounds:
        raise TraceError("too_many_rounds", f"{len(pairs)} annotations > {tool_rounds} tool rounds")
    results = await _calculated(pairs)
    calls = [_tool_call(index, expression) for index, (expression, _) in enumerate(pairs)]
    answers = [{"role": "tool", "tool_call_id": c["id"], "content": text} for c, text in zip(calls, results)]
    if tool_rounds == 1:
        turns = [
            {"role": "assistant", "content": None, "tool_calls": calls},
            *answers,
            {"role": "assistant", "content": f"{reasoning(chain)}\n\n{answer}"},
        ]
    else:
        texts = turn_texts(chain)
        turns = []
        for text, tool_call, tool_answer in zip(texts, calls, answers):
            turns += [{"role": "assistant", "content": text or None, "tool_calls": [tool_call]}, tool_answer]
        closing = texts[-1]
        turns.append({"role": "assistant", "content": f"{closing}\n\n{answer}" if closing else answer})
    messages = [*prompt_messages(str(row["question"])), *turns]
    return {"id": row["id"], "source": row.get("source", "gsm8k"), "messages": messages, "tools": tools}, len(pairs)


def build_traces(
    rows: Sequence[dict[str, Any]], origins: Sequence[str], tool_rounds: int = TOOL_ROUNDS_DEFAULT
) -> TraceResult:
    """Traces of the rows (imported by `calcx.data.importers`) for an agent of `tool_rounds`, each
    skip named by its origin."""
    tools = [calculator_tool_entry()]

    async def run() -> TraceResult:
        result = TraceResult()
        for row, where in zip(rows, origins):
            try:
                trace, calls = await build_trace(row, tools, tool_rounds)
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
