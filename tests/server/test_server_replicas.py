"""calcx.server.replicas on its own: which replica a rollout's calls go to, as load and failures change."""

from __future__ import annotations

from collections import Counter

from calcx.server.replicas import Replicas

A, B, C = "http://a/v1", "http://b/v1", "http://c/v1"
ALL = [A, B, C]


def homes(replicas: Replicas, rollouts: list[str], endpoints: list[str] = ALL) -> list[str]:
    return [replicas.order(r, endpoints)[0] for r in rollouts]


def test_new_rollouts_spread_over_idle_replicas_in_the_registry_order() -> None:
    replicas = Replicas()
    assert homes(replicas, [f"r{i}" for i in range(7)]) == [A, B, C, A, B, C, A]
    assert [s.rollouts for s in replicas.states()] == [3, 2, 2]


def test_a_rollout_keeps_its_replica_whatever_the_load() -> None:
    replicas = Replicas()
    first = replicas.order("r", ALL)[0]
    with replicas.sending(first), replicas.sending(first):
        assert replicas.order("r", ALL)[0] == first


def test_a_new_rollout_goes_where_fewest_calls_are_in_flight() -> None:
    replicas = Replicas()
    homes(replicas, ["r0", "r1", "r2"])  # one rollout at home on each
    with replicas.sending(A), replicas.sending(B), replicas.sending(B):
        assert replicas.order("new", ALL) == [C, A, B]  # the others least loaded first
    with replicas.sending(C):  # C: a call in flight and two rollouts; A and B: one rollout each
        assert replicas.order("newer", ALL)[0] == A


def test_a_failed_replica_gets_no_new_rollout_and_its_rollouts_move_until_it_answers() -> None:
    replicas = Replicas()
    assert homes(replicas, ["r0", "r1"]) == [A, B]
    with replicas.sending(B):
        assert replicas.order("r1", ALL) == [B, C, A]  # its call is under way on B ...
        assert replicas.failed(B) and not replicas.failed(B)  # ... and B fails
    replicas.answered("r1", C)  # the retry on the next replica answered: r1 lives on C from now on
    assert [s.rollouts for s in replicas.states()] == [1, 0, 1]
    assert replicas.order("r1", ALL) == [C, A, B]  # B, down, last
    assert homes(replicas, ["n1", "n2", "n3"]) == [A, C, A]  # never B, though it is the least loaded
    replicas.failed(A)
    assert replicas.order("r0", ALL)[0] == C  # a home found down moves before the call is sent
    replicas.revived(B)
    assert replicas.order("n4", ALL)[0] == B


def test_a_replica_that_answers_is_up_again() -> None:
    replicas = Replicas()
    replicas.order("r", [A, B])
    replicas.failed(A)
    replicas.answered("r", A)
    assert [s.up for s in replicas.states()] == [True, True]


def test_with_every_replica_down_calls_still_go_out() -> None:
    replicas = Replicas()
    replicas.order("r", [A, B])
    replicas.failed(A)
    replicas.failed(B)
    assert sorted(replicas.order("s", [A, B])) == [A, B]


def test_a_replica_left_out_of_the_registry_is_down_until_it_answers() -> None:
    replicas = Replicas()
    assert homes(replicas, ["r0", "r1"], [A, B]) == [A, B]
    assert replicas.order("r0", [B]) == [B]  # r0's home is gone: it moves
    assert replicas.order("r2", [A, B])[0] == B  # A is back in the registry but has not answered
    assert replicas.down([A, B]) == [A]
    replicas.revived(A)
    assert replicas.order("r3", [A, B])[0] == A


def test_an_ended_rollout_leaves_its_replica() -> None:
    replicas = Replicas()
    assert homes(replicas, ["r0", "r1", "r2"]) == [A, B, C]
    replicas.release("r1")
    replicas.release("never-seen")
    assert [s.rollouts for s in replicas.states()] == [1, 0, 1]
    assert replicas.order("r3", ALL)[0] == B
    replicas.answered("r1", A)  # a late answer to the ended rollout gives it no home again
    assert [s.rollouts for s in replicas.states()] == [1, 1, 1]


def test_calls_in_flight_are_counted_while_they_run() -> None:
    replicas = Replicas()
    replicas.order("r", ALL)
    with replicas.sending(B):
        with replicas.sending(B):
            assert Counter({s.endpoint: s.in_flight for s in replicas.states()}) == Counter({B: 2})
    assert [s.in_flight for s in replicas.states()] == [0, 0, 0]
