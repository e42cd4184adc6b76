"""Wake-ups for long polls: waiters sleep on a future until a state change fires it.

Handlers check the store, then (with no `await` in between) register here, so a change made
by another request between the check and the sleep cannot be missed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Broadcast:
    """Wakes every current waiter when fired."""

    def __init__(self) -> None:
        self._waiters: set[asyncio.Future[None]] = set()

    def __len__(self) -> int:
        return len(self._waiters)

    async def wait(self, timeout: float) -> bool:
        """Sleep until fired or `timeout` seconds pass; True when fired."""
        if timeout <= 0:
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.add(fut)
        try:
            await asyncio.wait_for(fut, timeout)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            self._waiters.discard(fut)

    def fire(self) -> None:
        waiters, self._waiters = self._waiters, set()
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)


class KeyedBroadcast:
    """One Broadcast per key (a rollout id), created on demand and dropped when idle."""

    def __init__(self) -> None:
        self._by_key: dict[str, Broadcast] = {}

    async def wait(self, key: str, timeout: float) -> bool:
        signal = self._by_key.get(key)
        if signal is None:
            signal = self._by_key[key] = Broadcast()
        try:
            return await signal.wait(timeout)
        finally:
            if not len(signal) and self._by_key.get(key) is signal:
                del self._by_key[key]

    def fire(self, key: str) -> None:
        signal = self._by_key.get(key)
        if signal is not None:
            signal.fire()


class Signals:
    """The server's wake-up points: queued work, terminal attempts, per-rollout terminal state."""

    def __init__(self) -> None:
        self.queued = Broadcast()
        self.terminal = Broadcast()
        self.rollout_terminal = KeyedBroadcast()
        self.attempt_ended: list[Callable[[str], None]] = []  # called with the rollout id

    def ended(self, rollout_id: str) -> None:
        """An attempt of `rollout_id` became terminal: wake its waiters, tell the listeners."""
        self.rollout_terminal.fire(rollout_id)
        for listener in self.attempt_ended:
            listener(rollout_id)

    def fire_all(self) -> None:
        """Used at shutdown so long polls answer at once."""
        self.queued.fire()
        self.terminal.fire()
        for signal in list(self.rollout_terminal._by_key.values()):
            signal.fire()
