"""The attempt ledger's transitions, one rule each: what a heartbeat, a stop's cancel and a stop's
release may do to an attempt in each state, and what the ledger keeps after an attempt's task."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from calcx.controller.attempts import MAX_UNREPORTED, AttemptKey, Attempts, AttemptStateError, State

A, B, C, X, Y = ("r-a", "1"), ("r-b", "1"), ("r-c", "1"), ("r-x", "1"), ("r-y", "1")


def task() -> asyncio.Task[None]:
    """The ledger only holds an attempt's task; it never touches it."""
    return cast("asyncio.Task[None]", object())


def launched(*keys: AttemptKey, max_unreported: int = MAX_UNREPORTED) -> Attempts:
    attempts = Attempts(max_unreported)
    for key in keys:
        attempts.launch(key, task())
    return attempts


def unreported(attempts: Attempts, key: AttemptKey) -> AttemptKey | None:
    """`key` runs, its report is not taken, its task ends: what the ledger forgot for it."""
    attempts.begin_report(key)
    forgotten = attempts.report_not_taken(key)
    attempts.end_report(key)
    attempts.task_done(key)
    return forgotten


def test_a_heartbeat_takes_back_a_running_attempt_but_none_whose_run_has_ended() -> None:
    attempts = launched(A, B, C, X)
    attempts.begin_report(B)
    attempts.begin_report(C)
    attempts.report_not_taken(C)
    attempts.begin_report(X)
    attempts.end_report(X)
    assert [attempts.take_back(key) for key in (A, B, C, X, Y)] == [True, False, False, False, False]
    assert [attempts.state(key) for key in (A, B, C, X)] == [
        State.TAKEN_BACK,
        State.REPORTING,
        State.UNREPORTED,
        State.REPORTED,
    ]


def test_a_stops_cancel_reports_an_attempt_unless_the_server_took_it_back() -> None:
    attempts = launched(A, B)
    attempts.take_back(B)
    assert attempts.stop_reports(A) and not attempts.stop_reports(B)
    attempts.begin_report(B)  # a runner that returned a result all the same still reports it
    assert attempts.state(B) is State.REPORTING


def test_a_stops_cancel_spares_an_attempt_whose_run_has_ended() -> None:
    attempts = launched(A, B, C, X)
    attempts.take_back(B)
    for key in (C, X):
        attempts.begin_report(key)
    attempts.end_report(X)
    assert [attempts.run_ended(key) for key in (A, B, C, X)] == [False, False, True, True]
    attempts.report_not_taken(C)
    assert attempts.run_ended(C)


def test_an_attempt_leaves_with_its_task_unless_its_report_was_not_taken() -> None:
    attempts = launched(A, B, C)
    attempts.take_back(C)
    attempts.begin_report(A)
    attempts.end_report(A)
    unreported(attempts, B)
    for key in (A, C):
        attempts.task_done(key)
    assert [attempts.state(key) for key in (A, B, C)] == [None, State.UNREPORTED, None]
    assert len(attempts.tasks) == 0


def test_known_is_what_runs_or_went_unreported_not_what_was_reported_or_never_run() -> None:
    attempts = launched(A, B, C, X)
    attempts.begin_report(A)
    attempts.end_report(A)
    attempts.task_done(A)  # reported: the server holds its result
    unreported(attempts, B)
    attempts.begin_report(C)  # still reporting
    attempts.hold_unrun([Y])
    assert attempts.known() == {B, C, X}


def test_past_the_bound_the_attempt_unreported_longest_ago_is_forgotten() -> None:
    attempts = launched(A, B, C, max_unreported=2)
    assert unreported(attempts, B) is None
    assert unreported(attempts, A) is None
    assert unreported(attempts, C) == B  # B went unreported first, though A was claimed first
    assert [attempts.state(key) for key in (A, B, C)] == [State.UNREPORTED, None, State.UNREPORTED]
    assert attempts.known() == {A, C}


def test_an_attempt_forgotten_while_its_task_ends_leaves_with_the_task() -> None:
    attempts = launched(A, B, max_unreported=1)
    attempts.begin_report(A)
    attempts.report_not_taken(A)
    attempts.begin_report(B)
    assert attempts.report_not_taken(B) == A
    assert attempts.known() == {A, B} and attempts.run_ended(A)  # A still ends its report's task
    attempts.task_done(A)
    assert attempts.state(A) is None and attempts.known() == {B}


def test_the_default_bound_keeps_ten_thousand_unreported_attempts() -> None:
    keys = [(f"r-{i}", "1") for i in range(MAX_UNREPORTED + 1)]
    attempts = launched(*keys)
    forgotten = [unreported(attempts, key) for key in keys]
    assert forgotten == [None] * MAX_UNREPORTED + [keys[0]]
    assert len(attempts.known()) == MAX_UNREPORTED == 10_000


def test_an_attempt_noted_unreported_twice_counts_once() -> None:
    attempts = launched(A, B, max_unreported=1)
    attempts.begin_report(A)
    attempts.report_not_taken(A)
    assert attempts.report_not_taken(A) is None
    assert unreported(attempts, B) == A


def test_the_release_ends_only_attempts_never_run_each_once_in_the_order_learnt() -> None:
    attempts = launched(A, B)
    unreported(attempts, B)
    assert not attempts.must_release()
    attempts.hold_unrun([X])  # a claim answer read after the stop
    attempts.hold_unrun([A, B, Y, X])  # what the server names as held
    assert attempts.unrun() == [X, Y]
    assert [attempts.state(key) for key in (A, B)] == [State.RUNNING, State.UNREPORTED]
    assert attempts.must_release()


def test_a_cancelled_claim_calls_for_a_release_with_nothing_yet_held() -> None:
    attempts = Attempts()
    attempts.claim_cancelled()
    assert attempts.must_release() and attempts.unrun() == []


def test_a_release_report_not_taken_leaves_the_attempt_known_as_unreported() -> None:
    attempts = Attempts()
    attempts.hold_unrun([X])
    attempts.report_not_taken(X)
    assert attempts.state(X) is State.UNREPORTED and attempts.unrun() == []


@pytest.mark.parametrize("step", ["launch again", "report unknown", "report twice", "not taken unknown"])
def test_a_transition_from_a_state_it_does_not_start_from_is_refused(step: str) -> None:
    attempts = launched(A)
    attempts.begin_report(A)
    attempts.end_report(A)
    with pytest.raises(AttemptStateError):
        {
            "launch again": lambda: attempts.launch(A, task()),
            "report unknown": lambda: attempts.begin_report(Y),
            "report twice": lambda: attempts.begin_report(A),
            "not taken unknown": lambda: attempts.report_not_taken(Y),
        }[step]()


def test_the_views_read_and_write_the_ledger() -> None:
    attempts = Attempts()
    attempts.tasks[A] = task()
    attempts.tasks[B] = task()
    attempts.runs_ended.add(B)
    assert attempts.state(A) is State.RUNNING and attempts.state(B) is State.REPORTING
    assert list(attempts.tasks) == [A, B] and set(attempts.runs_ended) == {B} and A not in attempts.runs_ended
    del attempts.tasks[A]
    assert attempts.state(A) is None and len(attempts.tasks) == 1
