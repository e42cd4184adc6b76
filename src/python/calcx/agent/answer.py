"""The task the agent is given and how its final answer is read back.

The answer format is Calc-X's: ``### ANSWER: <answer> ###``. Extraction uses the
regex ``###\\s*ANSWER:\\s*(.+?)(\\s*###|$)`` and falls back to the whole last
message. Model text can be huge or adversarial, so the text is bounded first
(long whitespace runs shortened, only the tail kept) to keep the regex linear.
"""

from __future__ import annotations

import re

from calcx.contract.env import AGENT_PROMPT_DEFAULT, AGENT_PROMPTS

ANSWER_RE = re.compile(r"###\s*ANSWER:\s*(.+?)(\s*###|$)")
INSTRUCTION = (
    "Solve the problem. Use the calculator tool for any arithmetic. "
    "When you are done, give the final answer in the form ### ANSWER: <answer> ###"
)
#: The system messages the agent can open its chat with, by the names the contract lists
#: (CALCX_AGENT_PROMPT). `calculator-first` shows a call with single braces: the Qwen2.5 chat
#: template's own example doubles them, and a model copying it writes calls its parser cannot read.
SYSTEM_MESSAGES = {
    "plain": (
        "You are a careful math assistant. You can call a calculator tool that evaluates "
        "arithmetic expressions. Always finish with the final answer as ### ANSWER: <answer> ###"
    ),
    "calculator-first": (
        "You are a careful math assistant with a calculator tool. Do not compute numbers in your head: "
        "work out the steps of the solution, then call the calculator with the arithmetic they need "
        "(one expression, or one call per step) and use the results it returns. A call is written as\n"
        '<tool_call>\n{"name": "calculate", "arguments": {"expression": "3 * 40 + 5 * 40"}}\n</tool_call>\n'
        "Always finish with the final answer as ### ANSWER: <answer> ###"
    ),
    "calculator-steps": (
        "You are a careful math assistant with a calculator tool. Solve the problem step by step: say in words "
        "what each step finds, then get its number from the calculator, never from your head, and use that "
        "number in the next steps. Give the calculator plain arithmetic: numbers, + - * / ** and parentheses, "
        "with no units, commas, words, variables or LaTeX. Several independent steps may be computed in one "
        "round of calls. A call is written as\n"
        '<tool_call>\n{"name": "calculate", "arguments": {"expression": "48 / 2"}}\n</tool_call>\n'
        "When the last step is done, finish with the final answer as ### ANSWER: <answer> ###"
    ),
}
if tuple(SYSTEM_MESSAGES) != AGENT_PROMPTS:  # the contract names them; a text for each, no more
    raise ImportError(
        f"calcx.agent.answer.SYSTEM_MESSAGES names {tuple(SYSTEM_MESSAGES)}, the contract {AGENT_PROMPTS}"
    )
MAX_MESSAGE_CHARS = 100_000
_MAX_WHITESPACE_RUN = 64
_LONG_WHITESPACE_RE = re.compile(r"\s{%d,}" % (_MAX_WHITESPACE_RUN + 1))


def build_task(question: str) -> str:
    """The user message: the question, a blank line, then the answer-format instruction."""
    return f"{question.strip()}\n\n{INSTRUCTION}"


def prompt_messages(question: str, prompt: str = AGENT_PROMPT_DEFAULT) -> list[dict[str, str]]:
    """The system and user messages the agent's first model call starts with (AutoGen sends the
    system message named `prompt`, then the task as the user turn)."""
    return [{"role": "system", "content": SYSTEM_MESSAGES[prompt]}, {"role": "user", "content": build_task(question)}]


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
