"""Failure reasons have one source, `FailureReason`: its members are their plain names on every
wire, the contract's tables are built from it, and no reason is written as bare text in a reason
position of calcx's code (mypy refuses most such places through the types; this finds the rest)."""

from __future__ import annotations

import ast
import json
import sqlite3
from pathlib import Path

import pytest

from calcx.api.models import FinishRequest
from calcx.contract.failures import (
    EXIT_CODES,
    FAILURE_REASONS,
    REASONS_BY_EXIT_CODE,
    FailureReason,
    failure_line,
    parse_failure_line,
    reason_from_agent_exit,
)
from calcx.controller.base import RunResult

#: calls whose arguments are failure reasons (their text would bypass the enum)
REASON_CALLS = {"failed", "fail", "finish", "failure_line", "_finish_locked"}


def source_root() -> Path:
    """src/python/calcx as files (the `src/python/calcx:source_tree` target), from the sandbox or a clone."""
    for base in (Path.cwd(), *Path(__file__).resolve().parents):
        candidate = base / "src" / "python" / "calcx"
        if (candidate / "contract" / "failures.py").is_file():
            return candidate
    raise AssertionError("src/python/calcx not found: the test depends on src/python/calcx:source_tree")


def _is_reason(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in FAILURE_REASONS


def _names_reason(node: ast.AST) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return "reason" in name.lower()


def bare_reasons(source: str) -> list[tuple[int, str]]:
    """(line, text) of each reason written as a string where a reason goes."""
    found: list[ast.AST] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            first = node.args[0] if node.args else None
            failed_label = name == "labels" and isinstance(first, ast.Constant) and first.value == "FAILED"
            if name in REASON_CALLS or failed_label:
                found += [arg for arg in node.args if _is_reason(arg)]
        elif isinstance(node, ast.keyword) and node.arg == "reason" and _is_reason(node.value):
            found.append(node.value)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_names_reason(t) for t in targets) and node.value is not None:
                found += [n for n in ast.walk(node.value) if _is_reason(n)]
        elif isinstance(node, ast.Compare) and any(_names_reason(n) for n in (node.left, *node.comparators)):
            found += [n for n in (node.left, *node.comparators) if _is_reason(n)]
        elif isinstance(node, ast.Tuple) and len(node.elts) == 2:
            state, reason = node.elts
            if isinstance(state, ast.Constant) and state.value == "FAILED" and _is_reason(reason):
                found.append(reason)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "reason" and _is_reason(value):
                    found.append(value)
    return sorted((n.lineno, str(n.value)) for n in found if isinstance(n, ast.Constant))


def test_the_tables_are_built_from_the_enum() -> None:
    assert FAILURE_REASONS == {reason.value for reason in FailureReason}
    assert all(isinstance(reason, FailureReason) for reason in EXIT_CODES)
    assert all(REASONS_BY_EXIT_CODE[code] is reason for reason, code in EXIT_CODES.items())


@pytest.mark.parametrize("reason", list(FailureReason))
def test_a_member_is_its_plain_name_wherever_it_goes(reason: FailureReason) -> None:
    """Stored and sent values stay byte-identical to the names before the enum."""
    assert f"{reason}" == str(reason) == reason.value and json.dumps(reason) == json.dumps(reason.value)
    db = sqlite3.connect(":memory:")
    assert db.execute("SELECT ?, typeof(?)", (reason, reason)).fetchone() == (reason.value, "text")
    assert parse_failure_line(failure_line(reason, "detail")) is reason
    if reason is FailureReason.CANCELLED_BY_API:  # the cancel API's own: no controller reports it
        with pytest.raises(ValueError, match="cancel API only"):
            FinishRequest(state="FAILED", reason=reason.value)
    else:
        assert FinishRequest(state="FAILED", reason=reason.value).reason == reason
    assert RunResult.failed(reason).finish_body()["reason"] == reason.value


def test_a_reason_outside_the_enum_is_refused() -> None:
    with pytest.raises(ValueError, match="not a known failure reason"):
        RunResult.failed("oom")  # type: ignore[arg-type]  # what mypy refuses, refused at run time too
    assert parse_failure_line(failure_line(FailureReason.CRASH, "x").replace("crash", "oom")) is None
    assert reason_from_agent_exit(-9, None) is FailureReason.CRASH


def test_the_scan_finds_bare_reasons_in_every_reason_position() -> None:
    sample = (
        'RunResult.failed("timeout", detail="x")\n'
        'failure_line("crash", "d")\n'
        'client.finish(r, a, "FAILED", reason="cancelled")\n'
        'class F:\n    reason = "calculator_failed"\n'
        'if result.reason == "controller_lost": pass\n'
        'PLAN = {"k": ("FAILED", "model_aborted")}\n'
        'body = {"state": "FAILED", "reason": "image_pull"}\n'
        'metrics.finished.labels("FAILED", "bad_environment").inc()\n'
        'ok = request.extensions.get("timeout")\n'  # a word, not a reason: left alone
        'metrics.upstream_errors.labels("timeout").inc()\n'
    )
    assert [text for _, text in bare_reasons(sample)] == [
        "timeout",
        "crash",
        "cancelled",
        "calculator_failed",
        "controller_lost",
        "model_aborted",
        "image_pull",
        "bad_environment",
    ]


def test_no_bare_failure_reason_in_calcx() -> None:
    root = source_root()
    contract = root / "contract" / "failures.py"
    offenders = [
        f"{path.relative_to(root.parent)}:{line}: {text!r}"
        for path in sorted(root.rglob("*.py"))
        if path != contract
        for line, text in bare_reasons(path.read_text(encoding="utf-8"))
    ]
    assert len(list(root.rglob("*.py"))) > 100  # the whole tree is there, not a part of it
    assert offenders == [], "name failure reasons by their FailureReason member:\n" + "\n".join(offenders)
