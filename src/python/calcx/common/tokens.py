"""When two model calls are one token sequence.

A later call continues an earlier one when its prompt tokens begin with the earlier call's prompt
tokens followed by the tokens the model generated for it: then the later call adds only the tokens
between (a tool's answer, the next turn's header) and its own answer. The trainer joins such calls
(calcx.trainer.rollouts.call_join); benchmarks/call_prefix.py counts them in a store. Plain lists of ints.
"""

from __future__ import annotations

from collections.abc import Sequence


def continues(prompt: Sequence[int], earlier_prompt: Sequence[int], earlier_generated: Sequence[int]) -> bool:
    """Whether `prompt` begins with `earlier_prompt` and then `earlier_generated`."""
    split, end = len(earlier_prompt), len(earlier_prompt) + len(earlier_generated)
    return list(prompt[:split]) == list(earlier_prompt) and list(prompt[split:end]) == list(earlier_generated)
