"""Failure modes the stub model can play, and how a request picks one.

Precedence: a marker in the conversation's text (``[stub:wrong]``,
``[stub:slow=0.5]``) beats the ``x-stub-mode`` header, which beats the server's
``--mode``. Header and server mode accept the same ``name`` or ``name=seconds``.
"""

from __future__ import annotations

from dataclasses import dataclass

from calcx.stub_llm.script import MARKER_RE

MODES = {
    "normal": "call the calculator, then answer ### ANSWER: <tool result> ###",
    "direct": "answer at once, without calling the tool",
    "wrong": "call the calculator, then answer a different number",
    "noformat": "call the calculator, then answer without the ### ANSWER: ### format",
    "badjson": "call the calculator with arguments that are not valid JSON",
    "steps": "call the calculator one call a round, each on the last result plus 1 (name=count calls, default 3), "
    "then answer the last result",
    "unknowntool": "call a tool that was not offered",
    "error500": "answer every request with HTTP 500",
    "overlong": "call the calculator, then refuse the next request as vLLM refuses a conversation past the "
    "model's context (HTTP 400)",
    "slow": "wait (default 1 s, or name=seconds) and then behave normally",
    "hang": "never answer (waits --hang-s, default 3600 s)",
}
ALIASES = {
    "500": "error500",
    "http500": "error500",
    "no_format": "noformat",
    "bad_json": "badjson",
    "unknown_tool": "unknowntool",
}


class ModeError(ValueError):
    """An unknown mode name."""


@dataclass(frozen=True)
class Mode:
    name: str
    seconds: float | None = None


def parse_mode(text: str) -> Mode:
    """``name`` or ``name=seconds`` -> Mode; ModeError names the valid modes."""
    raw = text.strip().lower()
    name, _, seconds = raw.partition("=")
    name = ALIASES.get(name, name)
    if name not in MODES:
        raise ModeError(f"unknown stub mode {text!r}; valid modes: {', '.join(MODES)}")
    if seconds:
        try:
            value = float(seconds)
        except ValueError:
            raise ModeError(f"stub mode {text!r}: {seconds!r} is not a number of seconds") from None
        if not 0 <= value <= 86_400:
            raise ModeError(f"stub mode {text!r}: seconds must be between 0 and 86400")
        return Mode(name, value)
    return Mode(name)


def marker_mode(text: str) -> Mode | None:
    """The mode a ``[stub:...]`` marker in ``text`` asks for, if any (unknown markers are errors)."""
    match = MARKER_RE.search(text)
    if match is None:
        return None
    name = match.group(1) + (f"={match.group(2)}" if match.group(2) else "")
    return parse_mode(name)


def select_mode(conversation_text: str, header: str | None, server_mode: Mode) -> Mode:
    return marker_mode(conversation_text) or (parse_mode(header) if header else None) or server_mode
