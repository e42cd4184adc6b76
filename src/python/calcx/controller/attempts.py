"""The controller's ledger of the attempts it holds: one state per attempt, and the transitions
the claim loop, the heartbeat and a stop take it through.

Its rules, in one place:

- What this controller ran is never reported twice. A heartbeat's "lost" stops no attempt whose
  run has ended (the answer crossed its report: the server already holds the result); the stop
  of an attempt the server took back (cancel API, lapsed lease) reports nothing; a stop's release
  ends only attempts this process never ran, told apart by :meth:`Attempts.known`, taken before
  the server is asked which attempts it holds.
- A stop's cancel spares an attempt whose run has ended: its own report goes on.
- An attempt whose report the server never took may still be RUNNING there, and is kept so that
  the release does not take it for one never run: at most ``MAX_UNREPORTED`` of them, the oldest
  forgotten first (a server restart renews every lease, so age says nothing).
- Every other attempt leaves the ledger when its task ends.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Iterable, Iterator, MutableMapping, Set
from typing import cast

AttemptKey = tuple[str, str]  # (rollout_id, attempt_id)

#: How many attempts whose report the server never took the controller remembers.
MAX_UNREPORTED = 10_000


class State(enum.Enum):
    RUNNING = "running"  # its runner has it
    TAKEN_BACK = "taken back"  # the server ended it while it ran; its stop reports nothing
    REPORTING = "reporting"  # its run has ended; its result is on its way to the server
    REPORTED = "reported"  # the server took the result, or refused it as no longer RUNNING there
    UNREPORTED = "unreported"  # the server never took the result and may hold it RUNNING
    UNRUN = "unrun"  # held for this controller, which never started it; a stop's release ends it


#: The states of an attempt whose run has ended: a heartbeat or a stop's cancel leaves it be.
RUN_ENDED = frozenset({State.REPORTING, State.REPORTED, State.UNREPORTED})


class AttemptStateError(RuntimeError):
    """A transition from a state it does not start from: a bug in the controller."""


class Attempts:
    """Each attempt this controller holds, in one :class:`State`, with the task it runs in while
    it has one. ``claims_unread``: a stop cancelled a claim request, so the server may hold
    attempts for this controller that it never read, and whose ids only the server knows."""

    def __init__(self, max_unreported: int = MAX_UNREPORTED) -> None:
        self.max_unreported = max_unreported
        self.claims_unread = False
        # an attempt moves to the end as it becomes unreported: the first unreported is the oldest
        self._states: dict[AttemptKey, State] = {}
        self._tasks: dict[AttemptKey, asyncio.Task[None]] = {}
        self._unreported = 0  # how many are UNREPORTED; only report_not_taken changes it

    # -- what the controller asks -------------------------------------------------------
    def state(self, key: AttemptKey) -> State | None:
        return self._states.get(key)

    @property
    def tasks(self) -> TasksView:
        """The attempts that run in a task (running, reporting, ending), by key."""
        return TasksView(self)

    @property
    def runs_ended(self) -> RunsEndedView:
        """The attempts whose run has ended (``add`` is :meth:`begin_report`)."""
        return RunsEndedView(self)

    def run_ended(self, key: AttemptKey) -> bool:
        return self._states.get(key) in RUN_ENDED

    def stop_reports(self, key: AttemptKey) -> bool:
        """Whether a stop's cancel of this attempt is reported: not once the server took it back."""
        return self._states.get(key) is State.RUNNING

    def known(self) -> frozenset[AttemptKey]:
        """What this process ran or runs, which the release must never end: the attempts with a
        task and those whose report the server never took."""
        return frozenset(self._tasks) | frozenset(self._with(State.UNREPORTED))

    def unrun(self) -> list[AttemptKey]:
        """The attempts held for this controller that it never ran, in the order it learnt of them."""
        return self._with(State.UNRUN)

    def must_release(self) -> bool:
        """Whether the server may hold attempts for this controller that it never ran."""
        return self.claims_unread or bool(self.unrun())

    # -- transitions ---------------------------------------------------------------------
    def launch(self, key: AttemptKey, task: asyncio.Task[None]) -> None:
        """A claimed attempt starts in ``task``."""
        if key in self._states:
            raise AttemptStateError(f"{key} is already {self._states[key].value}")
        self._states[key] = State.RUNNING
        self._tasks[key] = task

    def take_back(self, key: AttemptKey) -> bool:
        """The server no longer counts a running attempt as ours: True when it is to be stopped,
        False for one whose run has ended (a heartbeat that crossed its report)."""
        if self._states.get(key) not in (State.RUNNING, State.TAKEN_BACK):
            return False
        self._states[key] = State.TAKEN_BACK
        return True

    def begin_report(self, key: AttemptKey) -> None:
        """Its run has ended (or a stop cancelled it): its result goes to the server."""
        self._move(key, (State.RUNNING, State.TAKEN_BACK), State.REPORTING)

    def end_report(self, key: AttemptKey) -> None:
        """Its report is over; one the server never took stays unreported."""
        if self._states.get(key) is State.REPORTING:
            self._states[key] = State.REPORTED

    def report_not_taken(self, key: AttemptKey) -> AttemptKey | None:
        """The server never took its report (unreachable, 5xx past the timeout, a refused body):
        it may still hold the attempt RUNNING. Returns the attempt forgotten past the bound."""
        if self._states.get(key) is State.UNREPORTED:
            return None
        self._move(key, (State.REPORTING, State.UNRUN), State.UNREPORTED)
        self._states[key] = self._states.pop(key)  # the newest unreported last
        self._unreported += 1
        if self._unreported <= self.max_unreported:
            return None
        oldest = next(k for k, state in self._states.items() if state is State.UNREPORTED)
        self._unreported -= 1
        if oldest in self._tasks:  # still ending: it leaves with its task
            self._states[oldest] = State.REPORTED
        else:
            del self._states[oldest]
        return oldest

    def task_done(self, key: AttemptKey) -> None:
        """Its task has ended: the attempt leaves the ledger unless its report was not taken."""
        self._tasks.pop(key, None)
        if self._states.get(key) is not State.UNREPORTED:
            self._states.pop(key, None)

    def claim_cancelled(self) -> None:
        """A stop cancelled a claim request the server may have answered."""
        self.claims_unread = True

    def hold_unrun(self, keys: Iterable[AttemptKey]) -> None:
        """Attempts held for this controller that it never started: a claim answer read after a
        stop, or those the server names that are not :meth:`known`. One it ran stays as it is."""
        for key in keys:
            self._states.setdefault(key, State.UNRUN)

    # -- inside --------------------------------------------------------------------------
    def _with(self, state: State) -> list[AttemptKey]:
        return [key for key, s in self._states.items() if s is state]

    def _move(self, key: AttemptKey, sources: tuple[State, ...], to: State) -> None:
        now = self._states.get(key)
        if now not in sources:
            raise AttemptStateError(f"{key} cannot become {to.value} from {now.value if now else 'unknown'}")
        self._states[key] = to


class TasksView(MutableMapping[AttemptKey, asyncio.Task[None]]):
    """A live view of the attempts that run in a task: assigning one launches it, deleting one
    ends its task (:meth:`Attempts.launch`, :meth:`Attempts.task_done`)."""

    def __init__(self, attempts: Attempts) -> None:
        self._attempts = attempts
        self._tasks = attempts._tasks

    def __getitem__(self, key: AttemptKey) -> asyncio.Task[None]:
        return self._tasks[key]

    def __setitem__(self, key: AttemptKey, task: asyncio.Task[None]) -> None:
        self._attempts.launch(key, task)

    def __delitem__(self, key: AttemptKey) -> None:
        if key not in self._tasks:
            raise KeyError(key)
        self._attempts.task_done(key)

    def __iter__(self) -> Iterator[AttemptKey]:
        return iter(self._tasks)

    def __len__(self) -> int:
        return len(self._tasks)


class RunsEndedView(Set[AttemptKey]):
    """A live view of the attempts whose run has ended; ``add`` begins an attempt's report."""

    def __init__(self, attempts: Attempts) -> None:
        self._attempts = attempts

    def __contains__(self, key: object) -> bool:
        return self._attempts.run_ended(cast(AttemptKey, key))

    def __iter__(self) -> Iterator[AttemptKey]:
        return iter([key for key in self._attempts._states if self._attempts.run_ended(key)])

    def __len__(self) -> int:
        return len(list(iter(self)))

    def add(self, key: AttemptKey) -> None:
        self._attempts.begin_report(key)
