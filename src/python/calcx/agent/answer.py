"""The task the agent is given and how its final answer is read back.

The answer format is Calc-X's: ``### ANSWER: <answer> ###``. Extraction uses the
regex ``###\\s*ANSWER:\\s*(.+?)(\\s*###|$)`` and falls back to the whole last
message. Model text can be huge or adversarial, so the text is bounded first
(long whitespace runs shortened, only the tail kept) to keep the regex linear.
"""

from __future__ import annotations

import re

ANSWER_RE = re.compile(r"###\s*ANSWER:\s*(.+?)(\s*###|$)")
INSTRUCTION = (
    "Solve the problem. Use the calculator tool for any arithmetic. "
    "When you are done, give the final answer in the form ### ANSWER: <answer> ###"
)
SYSTEM_MESSAGE = (
    "You are a careful math assistant. You can call a calculator tool that evaluates "
    "arithmetic expressions. Always finish with the final answer as ### ANSWER: <answer> ###"
)
MAX_MESSAGE_CHARS = 100_000
_MAX_WHITESPACE_RUN = 64
_LONG_WHITESPACE_RE = re.compile(r"\s{%d,}" % (_MAX_WHITESPACE_RUN + 1))


def build_task(question: str) -> str:
    """The user message: the question, a blank line, then the answer-format instruction."""
    return f"{question.strip()}\n\n{INSTRUCTION}"


def prompt_messages(question: str) -> list[dict[str, str]]:
    """The system and user messages the agent's first model call starts with (AutoGen sends the
    system message, then the task as the user turn)."""
    return [{"role": "system", "content": SYSTEM_MESSAGE}, {"role": "user", "content": build_task(question)}]


def format_answer(answer: str) -> str:
    """A final answer in the format the instruction asks for and `extract_answer` reads back."""
    return f"### ANSWER: {answer} ###"


def bound_text(text: str) -> str:
    """Keep the last MAX_MESSAGE_CHARS characters and cap whitespace runs."""
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[-MAX_MESSAGE_CHARS:]
    return _LONG_WHITESPACE_RE.sub(lambda m: m.group(0)[:_MAX_WHITESPACE_RUN], text)


def extract_answer(message: str | None) -> str:
    """The answer inside ``### ANSWER: ... ###``, else the whole (bounded) message, stripped."""
    text = bound_text(message or "")
    match = ANSWER_RE.search(text)
    if match:
        return match.group(1).strip()
    return text.strip()
