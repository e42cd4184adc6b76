"""A deadline on each request's head (request line and headers), for uvicorn's HTTP protocol.

uvicorn counts every open connection against `--max-connections` (its `limit_concurrency`) and
times out only idle keep-alive connections, and only until their next byte: a connection that
opens and sends nothing, or sends a request line and then a header a byte at a time, is held for
ever. Enough of them (no key or token needed) and every later request, a controller's heartbeat
among them, is answered 503 until leases lapse. Here a connection that has not sent a whole
request head `timeout_s` after it opened, or after the first byte of its next request, is closed.
An idle keep-alive connection is left to uvicorn's own timeout; a request whose head has arrived
(its body, the app's answer) is not bounded here.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol


def head_deadline_protocol(timeout_s: float, base: type[Any] = AutoHTTPProtocol) -> type[Any]:
    """uvicorn's protocol class (`base`: the one it picks itself) with the request-head deadline."""

    class HeadDeadlineProtocol(base):  # type: ignore[misc, valid-type]
        _head_timer: asyncio.TimerHandle | None = None

        def _awaiting_head(self) -> bool:
            cycle = self.cycle
            return cycle is None or cycle.response_complete

        def _arm_head_deadline(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(timeout_s, self._head_deadline_passed)

        def _cancel_head_deadline(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_deadline_passed(self) -> None:
            self._head_timer = None
            if self._awaiting_head() and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_head_deadline()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._awaiting_head():
                self._arm_head_deadline()  # part of a head: from its first byte
            else:
                self._cancel_head_deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._cancel_head_deadline()  # idle now: uvicorn's keep-alive timeout applies

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_head_deadline()
            super().connection_lost(exc)

    return HeadDeadlineProtocol
