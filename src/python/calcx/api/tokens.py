"""Attempt tokens: bearer tokens that open only one attempt's gateway and events URLs.

`calcx-at.<rid>.<aid>.<nonce>.<hex hmac-sha256(key, "<rid>/<aid>/<nonce>")>`. The nonce is drawn
when the attempt is claimed and stored with it (it is not secret: the MAC is what a holder of the
key alone can make), so a token opens only the attempt it was minted for: not an attempt of a
later rollout that reuses the id (after retention deleted the first), not one claimed again. An
agent that leaks its token exposes only its own attempt.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from calcx.contract.env import CALCX_KEY

PREFIX = "calcx-at."
#: The shortest server key accepted: an attempt token is an HMAC of known text under the key, so
#: a short key could be guessed offline from any one token.
MIN_KEY_CHARS = 32
HOW_TO_MAKE_A_KEY = "make one with `export CALCX_KEY=$(calcx server --new-key)` (or `openssl rand -hex 32`)"


def key_flag_refused(flag: str = "--key", file_flag: str = "--key-file") -> str:
    """What a key given on the command line (``flag KEY``) gets: a command line is readable by
    every process of the machine."""
    return (
        f"{flag} is not accepted: a key on the command line can be read by every process on the machine "
        f"(/proc/PID/cmdline, ps); set {CALCX_KEY} in the environment or pass {file_flag} FILE "
        "(a file only you can read)"
    )


KEY_FLAG_REFUSED = key_flag_refused()
#: Where a key comes from, for messages that say none was found (a sentence).
KEY_SOURCES = f"Set {CALCX_KEY} in the environment or pass --key-file FILE"


def read_server_key(env: Mapping[str, str], key_file: str | None, file_flag: str = "--key-file") -> str:
    """The server key: the text of ``key_file`` (surrounding whitespace dropped) when given, else
    ``env``'s CALCX_KEY; '' when neither has one. ValueError names an unreadable file."""
    if key_file is None:
        return env.get(CALCX_KEY, "")
    try:
        with open(key_file, encoding="utf-8") as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the server key from {file_flag} {key_file}: {exc}") from None


def new_key() -> str:
    """A fresh random server key (64 hex characters)."""
    return secrets.token_hex(32)


def process_server_key(env: Mapping[str, str], key_flag: str | None, key_file: str | None, *, missing: str) -> str:
    """The key a server or controller process runs with: `--key` refused (a key on a command line
    is readable in /proc), then `read_server_key`, then `key_problem`. ValueError says what is
    wrong; `missing` is the sentence for no key at all (after "no server key. ")."""
    if key_flag is not None:
        raise ValueError(KEY_FLAG_REFUSED)
    key = read_server_key(env, key_file)
    if not key:
        raise ValueError(f"no server key. {missing}")
    problem = key_problem(key)
    if problem is not None:
        raise ValueError(problem)
    return key


def key_problem(key: str) -> str | None:
    """Why ``key`` cannot be a server key (None when it can): empty, or shorter than MIN_KEY_CHARS."""
    if not key or not key.strip():
        return f"the server key is empty; {HOW_TO_MAKE_A_KEY}"
    if len(key) < MIN_KEY_CHARS:
        return (
            f"the server key has {len(key)} characters, fewer than {MIN_KEY_CHARS}: any attempt token would let "
            f"it be guessed offline; {HOW_TO_MAKE_A_KEY}"
        )
    return None


#: Random bytes of an attempt's nonce (hex in the token): ids of two attempts never share one.
NONCE_BYTES = 12


def new_nonce() -> str:
    """A fresh attempt nonce (hex, no dots)."""
    return secrets.token_hex(NONCE_BYTES)


@dataclass(frozen=True)
class AttemptScope:
    rollout_id: str
    attempt_id: str
    nonce: str


def _mac(key: str, rollout_id: str, attempt_id: str, nonce: str) -> str:
    message = f"{rollout_id}/{attempt_id}/{nonce}".encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


def attempt_token(key: str, rollout_id: str, attempt_id: str, nonce: str) -> str:
    """The token an agent uses for attempt `attempt_id` of rollout `rollout_id`, claimed with `nonce`."""
    if not nonce or "." in nonce:
        raise ValueError(f"an attempt nonce is non-empty and has no dots, got {nonce!r}")
    return f"{PREFIX}{rollout_id}.{attempt_id}.{nonce}.{_mac(key, rollout_id, attempt_id, nonce)}"


def verify_attempt_token(key: str, token: str) -> AttemptScope | None:
    """The attempt (and nonce) a token was minted for, or None when it is not a valid attempt token
    for `key`. Whether the nonce is the attempt's own is the server's check (it stores them)."""
    if not token.startswith(PREFIX):
        return None
    parts = token[len(PREFIX) :].rsplit(".", 3)
    if len(parts) != 4:
        return None
    rollout_id, attempt_id, nonce, mac = parts
    if not rollout_id or not attempt_id or not nonce:
        return None
    if not hmac.compare_digest(mac.encode(), _mac(key, rollout_id, attempt_id, nonce).encode()):
        return None
    return AttemptScope(rollout_id, attempt_id, nonce)
