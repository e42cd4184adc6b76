"""The rule by which two model calls are one sequence (calcx.common.tokens)."""

from __future__ import annotations

from calcx.common.tokens import continues


def test_a_prompt_that_holds_the_earlier_prompt_and_answer_continues_it() -> None:
    assert continues([1, 2, 3, 4, 5, 6], [1, 2], [3, 4])
    assert continues([1, 2, 3, 4], [1, 2], [3, 4])  # nothing between, nothing after: still a prefix
    assert continues((1, 2, 3), [1], (2,))  # any sequences of ints


def test_a_prompt_that_differs_anywhere_in_the_earlier_tokens_does_not() -> None:
    assert not continues([1, 2, 3, 9, 5], [1, 2], [3, 4])  # the answer rendered differently
    assert not continues([0, 2, 3, 4, 5], [1, 2], [3, 4])  # the earlier prompt's start cut away
    assert not continues([1, 2, 3], [1, 2], [3, 4])  # shorter than what it should hold
    assert not continues([1, 3, 4, 2], [1, 2], [3, 4])  # the same tokens, another order
