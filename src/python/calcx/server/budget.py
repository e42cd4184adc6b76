"""What one attempt may hold at once, counted before the work starts, so that the per-attempt caps
hold however many requests an agent sends concurrently.

- Requests in flight: every request to an attempt's URLs (its events, its gateway), once let in
  by its audience check and before its body is read, takes one of the attempt's
  `max_in_flight_per_attempt` places, and gives it back when it is answered, failed or cancelled.
  Past it the request is a 429 `too_many_requests`, so one agent's token cannot hold the server's
  connections, memory or event loop.
- Model calls: a call is reserved (one call, and its forwarded request's bytes) before it is
  forwarded, against the calls the store has recorded plus those reserved and not yet recorded.
  Past `max_calls_per_attempt` or `max_call_bytes_per_attempt` the call is a 413 `attempt_limit`,
  never forwarded nor recorded; a request whose Content-Length is more than the attempt's bytes
  left is refused before its body is read. The reservation ends when the call does (recorded,
  failed or cancelled), and the store's record then counts in its place.

Everything here runs on the event loop's thread, like the store: a check and its reservation
happen with no `await` between them, so no other request can pass a cap in between.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from calcx.server.errors import APIError
from calcx.server.settings import ServerSettings
from calcx.server.store.calls import Calls
from calcx.server.store.database import LimitReached

#: A refused request waits this long (seconds) before it is worth sending again.
RETRY_AFTER_S = 1


@dataclass
class _Held:
    requests: int = 0  # requests in flight with this attempt's URLs
    calls: int = 0  # model calls reserved and not yet recorded
    call_bytes: int = 0  # their forwarded requests' bytes

    @property
    def empty(self) -> bool:
        return self.requests == 0 and self.calls == 0 and self.call_bytes == 0


class AttemptBudgets:
    """The server's count of what each attempt holds now; nothing held, nothing kept."""

    def __init__(self, settings: ServerSettings) -> None:
        self._settings = settings
        self._held: dict[tuple[str, str], _Held] = {}

    def held(self, rollout_id: str, attempt_id: str) -> tuple[int, int, int]:
        """(requests in flight, calls reserved, bytes reserved) of one attempt."""
        held = self._held.get((rollout_id, attempt_id), _Held())
        return held.requests, held.calls, held.call_bytes

    def _release(self, key: tuple[str, str], held: _Held) -> None:
        if held.empty and self._held.get(key) is held:
            del self._held[key]

    @contextmanager
    def in_flight(self, rollout_id: str, attempt_id: str) -> Iterator[None]:
        """One of the attempt's places for a request in flight, or a 429 when all are taken."""
        key = (rollout_id, attempt_id)
        held = self._held.setdefault(key, _Held())
        limit = self._settings.max_in_flight_per_attempt
        if held.requests >= limit:
            self._release(key, held)
            raise APIError(
                429,
                "too_many_requests",
                f"attempt {attempt_id} of rollout {rollout_id!r} already has {held.requests} requests in flight; "
                f"one attempt may have at most {limit} at once (--max-in-flight-per-attempt): wait for an answer",
                {"Retry-After": str(RETRY_AFTER_S)},
            )
        held.requests += 1
        try:
            yield
        finally:
            held.requests -= 1
            self._release(key, held)

    def _check(
        self, calls: Calls, rollout_id: str, attempt_id: str, held: _Held, wanted: int | None, what: str
    ) -> None:
        """LimitReached unless the attempt has a call left and `wanted` bytes (None: unknown) fit in
        its bytes left; what it has counts the store's recorded calls and the reserved ones."""
        s = self._settings
        recorded, recorded_bytes = calls.usage(rollout_id, attempt_id)
        count, size = recorded + held.calls, recorded_bytes + held.call_bytes
        left = s.max_call_bytes_per_attempt - size
        if count < s.max_calls_per_attempt and left > 0 and (wanted is None or wanted <= left):
            return
        why = "" if wanted is None or wanted <= left else f"; {what} is {wanted} bytes and {max(left, 0)} are left"
        raise LimitReached(
            f"attempt {attempt_id} of rollout {rollout_id!r} has made or is making {count} model calls ({size} "
            f"bytes recorded or reserved){why}; one attempt may make at most {s.max_calls_per_attempt} calls and "
            f"record {s.max_call_bytes_per_attempt} bytes (--max-calls-per-attempt, --max-call-bytes-per-attempt)"
        )

    def require_room(self, calls: Calls, rollout_id: str, attempt_id: str, declared_bytes: int | None) -> None:
        """413 `attempt_limit` when the attempt has no call left, or (before its body is read) when a
        request declares more bytes than the attempt has left."""
        held = self._held.get((rollout_id, attempt_id), _Held())
        self._check(calls, rollout_id, attempt_id, held, declared_bytes, "this request (Content-Length)")

    @contextmanager
    def call(self, calls: Calls, rollout_id: str, attempt_id: str, request_bytes: int) -> Iterator[None]:
        """Reserve one model call of `request_bytes` (its request as forwarded) while it is sent and
        recorded; 413 `attempt_limit` when it does not fit in what the attempt has left."""
        key = (rollout_id, attempt_id)
        held = self._held.setdefault(key, _Held())
        try:
            self._check(calls, rollout_id, attempt_id, held, request_bytes, "this call's request as forwarded")
        except BaseException:
            self._release(key, held)
            raise
        held.calls += 1
        held.call_bytes += request_bytes
        try:
            yield
        finally:
            held.calls -= 1
            held.call_bytes -= request_bytes
            self._release(key, held)
