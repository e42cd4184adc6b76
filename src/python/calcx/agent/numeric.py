"""A small, bounded arithmetic parser for comparing answers.

Model text is hostile input: it must never be handed to ``eval`` or a
computer-algebra parser. This module tokenizes and evaluates only numbers,
``+ - * / ^ **``, parentheses and a postfix ``%``, in floating point, with hard
limits on input length, nesting, exponent size and result magnitude, so every
call finishes in time linear in a bounded input.
"""

from __future__ import annotations

import math
import re

MAX_EXPRESSION_CHARS = 512
MAX_TOKENS = 256
MAX_DEPTH = 32
MAX_EXPONENT = 1_000.0
MAX_MAGNITUDE = 1e100


class NumericError(ValueError):
    """The text is not a bounded arithmetic expression."""


_NUMBER = r"(?:\d{1,3}(?:,\d{3})+|\d+(?:_\d+)*)(?:\.\d*)?(?:[eE][+-]?\d{1,3})?|\.\d+(?:[eE][+-]?\d{1,3})?"
_TOKEN_RE = re.compile(rf"\s*(?:(?P<num>{_NUMBER})|(?P<op>\*\*|[-+*/^()%×÷]))")


def tokenize(text: str) -> list[str]:
    """Split ``text`` into number and operator tokens, or raise NumericError."""
    if len(text) > MAX_EXPRESSION_CHARS:
        raise NumericError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    tokens: list[str] = []
    pos = 0
    end = len(text.rstrip())
    while pos < end:
        match = _TOKEN_RE.match(text, pos)
        if match is None or match.end() == pos:
            raise NumericError(f"unexpected character {text[pos:pos + 1]!r} at {pos}")
        if match.group("num") is not None:
            tokens.append(match.group("num").replace(",", "").replace("_", ""))
        else:
            op = match.group("op")
            tokens.append({"×": "*", "÷": "/", "^": "**"}.get(op, op))
        if len(tokens) > MAX_TOKENS:
            raise NumericError(f"expression has more than {MAX_TOKENS} tokens")
        pos = match.end()
    if not tokens:
        raise NumericError("empty expression")
    return tokens


def _checked(value: float) -> float:
    if math.isnan(value) or math.isinf(value) or abs(value) > MAX_MAGNITUDE:
        raise NumericError("result out of range")
    return value


class _Parser:
    """Recursive descent: expr := term (('+'|'-') term)*; term := unary (('*'|'/') unary)*;
    unary := ('+'|'-') unary | power; power := postfix ('**' unary)?; postfix := atom '%'*;
    atom := NUMBER | '(' expr ')'."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.depth = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise NumericError("unexpected end of expression")
        self.pos += 1
        return token

    def parse(self) -> float:
        value = self.expr()
        if self.peek() is not None:
            raise NumericError(f"unexpected token {self.peek()!r}")
        return value

    def expr(self) -> float:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            right = self.term()
            value = _checked(value + right if op == "+" else value - right)
        return value

    def term(self) -> float:
        value = self.unary()
        while self.peek() in ("*", "/"):
            op = self.take()
            right = self.unary()
            if op == "*":
                value = _checked(value * right)
            else:
                if right == 0:
                    raise NumericError("division by zero")
                value = _checked(value / right)
        return value

    def unary(self) -> float:
        if self.peek() in ("+", "-"):
            op = self.take()
            self._enter()
            try:
                value = self.unary()
            finally:
                self.depth -= 1
            return -value if op == "-" else value
        return self.power()

    def power(self) -> float:
        base = self.postfix()
        if self.peek() == "**":
            self.take()
            self._enter()
            try:
                exponent = self.unary()
            finally:
                self.depth -= 1
            if abs(exponent) > MAX_EXPONENT:
                raise NumericError("exponent too large")
            try:
                result = math.pow(base, exponent)
            except (OverflowError, ValueError) as exc:
                raise NumericError(f"power out of range: {exc}") from None
            if isinstance(result, complex):  # pragma: no cover - math.pow never returns complex
                raise NumericError("complex result")
            return _checked(result)
        return base

    def postfix(self) -> float:
        value = self.atom()
        while self.peek() == "%":
            self.take()
            value = value / 100.0
        return value

    def atom(self) -> float:
        token = self.take()
        if token == "(":
            self._enter()
            try:
                value = self.expr()
            finally:
                self.depth -= 1
            if self.take() != ")":
                raise NumericError("missing ')'")
            return value
        if token[0].isdigit() or token[0] == ".":
            return _checked(float(token))
        raise NumericError(f"unexpected token {token!r}")

    def _enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise NumericError(f"nesting deeper than {MAX_DEPTH}")


def evaluate(text: str) -> float:
    """Evaluate a bounded arithmetic expression; raise NumericError when it is not one."""
    return _Parser(tokenize(text)).parse()


def try_evaluate(text: str) -> float | None:
    """Like :func:`evaluate`, but ``None`` instead of an error."""
    try:
        return evaluate(text)
    except NumericError:
        return None
