"""Which model replica a call goes to: least loaded for a new rollout, then sticky.

A rollout's calls share a growing prefix, which vLLM caches per replica, so every call of a
rollout goes to the replica its first call went to (its home). A rollout without a home gets the
least-loaded replica that is up: fewest calls in flight there, then fewest rollouts at home there,
then the earlier in the registry's list, so the same state always gives the same choice. A
replica whose try failed (no connection, a timeout, a 5xx) or that left the registry is down: no
rollout gets it as a new home, and the rollouts at home there move to the replica that answers
their next call. It is up again once it answers (a call, or the gateway's probe). With every
replica down, calls still go to them, least loaded first: one of them answering is the only way on.

Plain state on the event loop's thread (no await inside), so no locks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class ReplicaState:
    """One registered replica as `/metrics` shows it."""

    endpoint: str
    up: bool
    in_flight: int
    rollouts: int


class Replicas:
    def __init__(self) -> None:
        self._in_flight: Counter[str] = Counter()
        self._home: dict[str, str] = {}  # rollout id -> endpoint
        self._rollouts: Counter[str] = Counter()  # endpoint -> rollouts at home there
        self._down: set[str] = set()
        self._registered: tuple[str, ...] = ()

    def order(self, rollout_id: str, endpoints: list[str]) -> list[str]:
        """The endpoints in the order to try one call of `rollout_id`: its home first (chosen now
        when it has none, or its home is down or gone), then the others, up before down, each
        group least loaded first."""
        self._note_registry(endpoints)
        position = {e: i for i, e in enumerate(endpoints)}

        def rank(e: str) -> tuple[bool, int, int, int]:
            return e in self._down, self._in_flight[e], self._rollouts[e], position[e]

        home = self._home.get(rollout_id)
        if home not in position or home in self._down:
            home = min(endpoints, key=rank)
            self._move(rollout_id, home)
        assert home is not None
        return [home, *sorted((e for e in endpoints if e != home), key=rank)]

    @contextmanager
    def sending(self, endpoint: str) -> Iterator[None]:
        """One try in flight at `endpoint` for as long as the block runs."""
        self._in_flight[endpoint] += 1
        try:
            yield
        finally:
            self._in_flight[endpoint] -= 1
            if not self._in_flight[endpoint]:
                del self._in_flight[endpoint]

    def answered(self, rollout_id: str, endpoint: str) -> None:
        """`endpoint` answered a call of `rollout_id`: it is up, and the rollout's home (a call
        that failed over moves the rollout for good). A rollout released meanwhile stays released."""
        self._down.discard(endpoint)
        if rollout_id in self._home:
            self._move(rollout_id, endpoint)

    def failed(self, endpoint: str) -> bool:
        """A try at `endpoint` failed: it is down. True when it was up until now."""
        if endpoint in self._down:
            return False
        self._down.add(endpoint)
        return True

    def revived(self, endpoint: str) -> None:
        """`endpoint` answered the gateway's probe: new rollouts may get it again."""
        self._down.discard(endpoint)

    def release(self, rollout_id: str) -> None:
        """The rollout's attempt ended: it has no home any more (a retry gets one afresh)."""
        home = self._home.pop(rollout_id, None)
        if home is not None:
            self._drop(home)

    def down(self, endpoints: list[str]) -> list[str]:
        """Those of `endpoints` that are down."""
        return [e for e in endpoints if e in self._down]

    def states(self) -> list[ReplicaState]:
        """The registered replicas, in the registry's order."""
        return [ReplicaState(e, e not in self._down, self._in_flight[e], self._rollouts[e]) for e in self._registered]

    def _note_registry(self, endpoints: list[str]) -> None:
        registered = tuple(endpoints)
        if registered != self._registered:
            # a replica taken out of the registry is down until it answers, even if put back
            self._down.update(set(self._registered) - set(registered))
            self._registered = registered

    def _move(self, rollout_id: str, endpoint: str) -> None:
        old = self._home.get(rollout_id)
        if old == endpoint:
            return
        if old is not None:
            self._drop(old)
        self._home[rollout_id] = endpoint
        self._rollouts[endpoint] += 1

    def _drop(self, endpoint: str) -> None:
        self._rollouts[endpoint] -= 1
        if not self._rollouts[endpoint]:
            del self._rollouts[endpoint]
