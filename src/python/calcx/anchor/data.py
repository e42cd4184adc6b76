"""Calc-X rows -> the rows verl's ToolAgentLoop reads.

verl's loop opens the chat itself from `prompt`, so `prompt` holds what calcx's agent opens its
chat with: AutoGen's system message (the one `calcx.agent_prompt` names), then the user turn `build_task(question)` (the question and
the answer-format instruction). The other columns are calcx train's (calcx.trainer.run.data): one
`data_source`, ground truth and row index for both runs. No `tools_kwargs`: the calculator keeps
no per-trajectory state, so verl's default (nothing to pass to `create`) is all it needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from calcx.agent.answer import prompt_messages
from calcx.contract.env import AGENT_PROMPT_DEFAULT
from calcx.trainer.run.data import verl_record

# verl 0.9.1 registers its ToolAgentLoop under this name
TOOL_AGENT = "tool_agent"


def anchor_records(rows: Sequence[dict[str, Any]], prompt: str = AGENT_PROMPT_DEFAULT) -> list[dict[str, Any]]:
    """The rows opened with the system message named `prompt` (calcx.agent_prompt)."""
    return [
        verl_record(row, index, prompt=prompt_messages(str(row["question"]), prompt), agent_name=TOOL_AGENT)
        for index, row in enumerate(rows)
    ]
