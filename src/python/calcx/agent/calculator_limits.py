"""The calculator's bounds: how long an expression, how large a result, how much time per call,
and the CPU and memory of the calculator process.

`mcp_server_calculator` evaluates whatever the model writes: ``'9'*10**8`` builds 100 MB at once
and ``10**10**10`` asks for gigabytes. `bounded_evaluate` walks the expression as that package
does (the same nodes, operators, math names and result text) but checks each step's size before
it computes it, and answers past a bound with an error the model reads as the tool's reply
("Error executing tool calculate: ..."). `install` puts it in the package's place, so the agent's
MCP calculator and the in-process one (calcx.agent.calculator_inprocess) keep the package's tool
schema and error text.
`limit_process` is the backstop for whatever the checks miss: rlimits on the calculator process.

Standard library only (the package is imported by `install` alone).
"""

from __future__ import annotations

import ast
import math
import operator
import time
from collections.abc import Callable
from typing import Any

#: Longest expression accepted, in characters.
MAX_EXPRESSION_CHARS = 1000
#: Largest value (an integer's decimal digits, a string's characters) any step may produce.
MAX_RESULT_DIGITS = 1000
#: Time one evaluation may take, in seconds (checked at every node, so it holds in any thread).
MAX_CALL_S = 2.0
#: A calculator process whose one call has run this long is ended by whoever waits on it (the
#: in-process calculator's child): the per-node check cannot stop a single step that runs long.
CALL_KILL_S = MAX_CALL_S + 1.0
#: Largest argument of factorial, comb and perm (their cost grows faster than their result).
MAX_COMBINATORIC_ARG = 10_000
#: The calculator process's address space and CPU time (rlimits; the kernel ends it past them).
CALCULATOR_MEMORY_BYTES = 4 * 1024**3
CALCULATOR_CPU_S = 300

_OPERATORS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_NAMES: dict[str, Any] = {k: getattr(math, k) for k in dir(math) if not k.startswith("__")}
_NAMES.update({"pi": math.pi, "e": math.e})
_COMBINATORIC = {math.factorial, math.comb, math.perm}
_LOG10_2 = math.log10(2)


class CalculatorLimit(ValueError):
    """An expression past one of the calculator's bounds (the model reads the message)."""


def _digits(value: Any) -> int:
    """The size a value has when printed: an int's decimal digits, a string's length."""
    if isinstance(value, bool):
        return 1
    if isinstance(value, int):
        return int(abs(value).bit_length() * _LOG10_2) + 1
    if isinstance(value, str | bytes):
        return len(value)
    return 0


def _too_large(what: str) -> CalculatorLimit:
    return CalculatorLimit(
        f"{what} would have more than {MAX_RESULT_DIGITS} digits; " "the calculator refuses results that large"
    )


def time_limit_message(max_call_s: float = MAX_CALL_S) -> str:
    """What the model reads when an evaluation runs past its time."""
    return f"the expression took longer than {max_call_s:g} s to evaluate"


def _check_binop(op: type, left: Any, right: Any) -> None:
    """Refuse a step whose result would be too large, or too slow to compute, before computing it."""
    if op is ast.Mod and isinstance(left, str | bytes):
        # printf-style formatting: '%2147483647d' % 1 builds a 2 GB string inside one step,
        # before any size check could see it; arithmetic never needs it
        raise CalculatorLimit("the calculator does not format strings: `%` takes numbers only")
    if op is ast.Pow and isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
        if right * (abs(left).bit_length() - 1) * _LOG10_2 > MAX_RESULT_DIGITS:
            raise _too_large(f"{left} ** {right}")
    if op is ast.Mult:
        for seq, times in ((left, right), (right, left)):
            if isinstance(seq, str | bytes) and isinstance(times, int) and len(seq) * times > MAX_RESULT_DIGITS:
                raise _too_large("repeating a string")


def bounded_evaluate(expression: str, max_call_s: float = MAX_CALL_S) -> str:
    """`mcp_server_calculator`'s evaluate with bounds: the same answers within them, a
    CalculatorLimit past them (``max_call_s``: the time bound, MAX_CALL_S unless a test asks)."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorLimit(
            f"the expression is {len(expression)} characters; the calculator takes at most " f"{MAX_EXPRESSION_CHARS}"
        )
    deadline = time.monotonic() + max_call_s

    def walk(node: ast.AST) -> Any:
        if time.monotonic() >= deadline:
            raise CalculatorLimit(time_limit_message(max_call_s))
        value: Any
        if isinstance(node, ast.Constant):
            value = node.value
        elif isinstance(node, ast.Name):
            if node.id not in _NAMES:
                raise ValueError(f"Unknown identifier: {node.id}")
            value = _NAMES[node.id]
        elif isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = walk(node.left), walk(node.right)
            _check_binop(type(node.op), left, right)
            value = _OPERATORS[type(node.op)](left, right)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            value = -walk(node.operand)
        elif isinstance(node, ast.Call):
            func = walk(node.func)
            args = [walk(arg) for arg in node.args]
            if func in _COMBINATORIC and any(isinstance(a, int) and abs(a) > MAX_COMBINATORIC_ARG for a in args):
                raise CalculatorLimit(f"{func.__name__} takes arguments up to {MAX_COMBINATORIC_ARG} here")
            value = func(*args)
        else:
            raise ValueError(f"Unsupported operation: {ast.dump(node)}")
        if _digits(value) > MAX_RESULT_DIGITS:
            raise _too_large("the result")
        return value

    expression = expression.replace("^", "**").replace("×", "*").replace("÷", "/")
    return str(walk(ast.parse(expression, mode="eval").body))


def install() -> None:
    """Make `mcp_server_calculator`'s tool evaluate through `bounded_evaluate` (its `calculate`
    looks `evaluate` up in its module at each call)."""
    import mcp_server_calculator.calculator as package

    package.evaluate = bounded_evaluate


def limit_process(memory_bytes: int = CALCULATOR_MEMORY_BYTES, cpu_s: int = CALCULATOR_CPU_S) -> None:
    """Cap this process's address space and CPU time (lowering only: never raises a limit)."""
    import resource

    for which, value in ((resource.RLIMIT_AS, memory_bytes), (resource.RLIMIT_CPU, cpu_s)):
        soft, hard = resource.getrlimit(which)
        cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
        if soft == resource.RLIM_INFINITY or soft > cap:
            resource.setrlimit(which, (cap, hard))
