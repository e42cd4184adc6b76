"""Attempt tokens: one attempt's token opens that attempt only; no part of it can be reused."""

from __future__ import annotations

from calcx.api.tokens import PREFIX, attempt_token, verify_attempt_token

KEY = "k" * 40


def test_a_token_opens_its_own_attempt() -> None:
    scope = verify_attempt_token(KEY, attempt_token(KEY, "r-1", "1"))
    assert scope is not None and (scope.rollout_id, scope.attempt_id) == ("r-1", "1")


def test_an_agent_cannot_mint_its_retrys_token_from_its_own() -> None:
    """The MAC covers the attempt id: attempt 1's agent, renaming its token to attempt 2 (the retry
    that may run after it failed), gets no valid token."""
    mac = attempt_token(KEY, "r-1", "1").rsplit(".", 1)[1]
    for forged_attempt in ("2", "10", "1 "):
        assert verify_attempt_token(KEY, f"{PREFIX}r-1.{forged_attempt}.{mac}") is None


def test_a_token_does_not_open_another_rollout_or_key() -> None:
    mac = attempt_token(KEY, "r-1", "1").rsplit(".", 1)[1]
    assert verify_attempt_token(KEY, f"{PREFIX}r-2.1.{mac}") is None
    assert verify_attempt_token("m" * 40, attempt_token(KEY, "r-1", "1")) is None
