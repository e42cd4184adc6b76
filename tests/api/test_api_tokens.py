"""Attempt tokens: one attempt's token opens that attempt only; no part of it can be reused."""

from __future__ import annotations

from calcx.api.tokens import PREFIX, attempt_token, new_nonce, verify_attempt_token

KEY = "k" * 40
NONCE = "0123abcd"


def test_a_token_opens_its_own_attempt() -> None:
    scope = verify_attempt_token(KEY, attempt_token(KEY, "r-1", "1", NONCE))
    assert scope is not None and (scope.rollout_id, scope.attempt_id, scope.nonce) == ("r-1", "1", NONCE)


def test_an_agent_cannot_mint_its_retrys_token_from_its_own() -> None:
    """The MAC covers the attempt id: attempt 1's agent, renaming its token to attempt 2 (the retry
    that may run after it failed), gets no valid token."""
    mac = attempt_token(KEY, "r-1", "1", NONCE).rsplit(".", 1)[1]
    for forged_attempt in ("2", "10", "1 "):
        assert verify_attempt_token(KEY, f"{PREFIX}r-1.{forged_attempt}.{NONCE}.{mac}") is None


def test_a_token_does_not_open_another_rollout_or_key() -> None:
    mac = attempt_token(KEY, "r-1", "1", NONCE).rsplit(".", 1)[1]
    assert verify_attempt_token(KEY, f"{PREFIX}r-2.1.{NONCE}.{mac}") is None
    assert verify_attempt_token("m" * 40, attempt_token(KEY, "r-1", "1", NONCE)) is None


def test_the_mac_covers_the_nonce() -> None:
    """A token cannot be moved to another claim of the same ids: changing its nonce breaks its MAC."""
    mac = attempt_token(KEY, "r-1", "1", NONCE).rsplit(".", 1)[1]
    other = new_nonce()
    assert other != new_nonce() and "." not in other
    assert verify_attempt_token(KEY, f"{PREFIX}r-1.1.{other}.{mac}") is None
    assert verify_attempt_token(KEY, f"{PREFIX}r-1.1.{mac}") is None  # the old, unbound form
