"""Run leases against a real server on loopback, with two trainers' worth of clients: a second
start of a live run is refused (naming the run, the holder and when the lease lapses) unless it
takes the run over; once taken over, the first trainer's ledger records, rewinds and cancels are
refused; a lapsed or released lease needs no take-over; the table is bounded."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from calcx.api.client import CalcxAPIError, CalcxClient
from calcx.contract.labels import RUN_LABEL
from calcx.server.serve import ServerThread, start_server_thread

KEY = "run-lease-test-key-0123456789abcdef"
RUN = "calcx-grpo"


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    server = start_server_thread(str(tmp_path / "calcx.db"), KEY)
    try:
        yield server.url
    finally:
        server.stop()


def _refused(call, *args, **kwargs) -> CalcxAPIError:  # type: ignore[no-untyped-def]
    with pytest.raises(CalcxAPIError) as err:
        call(*args, **kwargs)
    return err.value


def _trained_rollout(client: CalcxClient, rid: str) -> None:
    """A SUCCEEDED rollout of RUN with a reward, ready to be trained."""
    client.create_rollout({"rollout_id": rid, "row": {"question": "q", "result": "1"}, "labels": {RUN_LABEL: RUN}})
    (claim,) = client.claim("ctl", 1, timeout_s=2).claims
    client.post_reward(rid, claim.attempt_id, 1.0)
    client.finish(rid, claim.attempt_id, "SUCCEEDED")


def test_a_second_start_of_a_live_run_is_refused_and_changes_nothing(url: str) -> None:
    with CalcxClient(url, KEY) as first, CalcxClient(url, KEY) as second:
        lease = first.acquire_lease(RUN, "trainer-a")
        assert (lease.owner, lease.live, lease.took_over) == ("trainer-a", True, False)
        _trained_rollout(first, "s1")
        first.record_trained(RUN, 1, ["s1"], owner="trainer-a")
        first.create_rollout(
            {"rollout_id": "queued", "row": {"question": "q", "result": "1"}, "labels": {RUN_LABEL: RUN}}
        )

        err = _refused(second.acquire_lease, RUN, "trainer-b")
        assert (err.status, err.code) == (409, "run_leased")
        lapse = time.strftime("%Y-%m-%dT%H:%M", time.gmtime(lease.expires_at))
        assert RUN in err.message and "'trainer-a'" in err.message and lapse in err.message
        assert "--take-over" in err.message
        # what the second start would do next is refused too, without the lease
        for refused in (
            _refused(second.cancel, run=RUN, owner="trainer-b"),
            _refused(second.rewind, RUN, 0, owner="trainer-b"),
            _refused(second.cancel, run=RUN),
        ):  # no owner: refused while a lease is live
            assert (refused.status, refused.code) == (409, "lease_lost")
        assert first.get_rollout("queued").state == "QUEUED"
        assert first.record_trained(RUN, 1, ["s1"], owner="trainer-a") == 1  # the ledger as it was
        assert first.renew_lease(RUN, "trainer-a").live


def test_a_take_over_fences_the_old_trainer_off(url: str) -> None:
    with CalcxClient(url, KEY) as old, CalcxClient(url, KEY) as new:
        old.acquire_lease(RUN, "trainer-a")
        _trained_rollout(old, "s1")
        old.record_trained(RUN, 1, ["s1"], owner="trainer-a")
        _trained_rollout(old, "s2")
        old.create_rollout(
            {"rollout_id": "queued", "row": {"question": "q", "result": "1"}, "labels": {RUN_LABEL: RUN}}
        )

        taken = new.acquire_lease(RUN, "trainer-b", take_over=True)
        assert (taken.owner, taken.previous_owner, taken.took_over) == ("trainer-b", "trainer-a", True)
        assert [r.rollout_id for r in new.cancel(run=RUN, owner="trainer-b")] == ["queued"]
        assert new.rewind(RUN, 0, owner="trainer-b") == [1]

        # the old trainer: each write it makes for the run is refused, not silently accepted
        for refused in (
            _refused(old.record_trained, RUN, 2, ["s1"], owner="trainer-a"),
            _refused(old.record_trained, RUN, 2, ["s2"], owner="trainer-a"),
            _refused(old.rewind, RUN, 0, owner="trainer-a"),
            _refused(old.cancel, run=RUN, owner="trainer-a"),
            _refused(old.renew_lease, RUN, "trainer-a"),
            _refused(old.release_lease, RUN, "trainer-a"),
        ):
            assert (refused.status, refused.code) == (409, "lease_lost")
            assert "'trainer-b'" in refused.message
        # ... nor revives its cancelled work
        retry = _refused(old.retry, "queued")
        assert retry.status == 409 and "cancel API" in retry.message
        assert old.get_rollout("queued").state == "FAILED"
        # the new holder's writes go through
        assert new.record_trained(RUN, 1, ["s1"], owner="trainer-b") == 1
        assert new.renew_lease(RUN, "trainer-b").live


def test_a_trainer_taken_over_cannot_cancel_the_runs_rollouts_by_id(url: str) -> None:
    with CalcxClient(url, KEY) as old, CalcxClient(url, KEY) as new:
        old.acquire_lease(RUN, "trainer-a")
        new.acquire_lease(RUN, "trainer-b", take_over=True)
        new.create_rollout(
            {"rollout_id": "new-work", "row": {"question": "q", "result": "1"}, "labels": {RUN_LABEL: RUN}}
        )
        new.create_rollout({"rollout_id": "unlabelled", "row": {"question": "q", "result": "1"}})

        refused = _refused(old.cancel, rollout_ids=["unlabelled", "new-work"], owner="trainer-a")
        assert (refused.status, refused.code) == (409, "lease_lost") and "'trainer-b'" in refused.message
        assert [new.get_rollout(rid).state for rid in ("new-work", "unlabelled")] == [
            "QUEUED",
            "QUEUED",
        ]  # nothing cancelled
        # the holder cancels its own work by id
        assert [r.rollout_id for r in new.cancel(rollout_ids=["new-work"], owner="trainer-b")] == ["new-work"]


def test_a_lapsed_or_released_lease_needs_no_take_over_and_still_fences(tmp_path: Path) -> None:
    server = start_server_thread(str(tmp_path / "calcx.db"), KEY, run_lease_s=0.3)
    try:
        with CalcxClient(server.url, KEY) as a, CalcxClient(server.url, KEY) as b:
            a.acquire_lease(RUN, "trainer-a")
            time.sleep(0.5)  # a stopped renewing (killed)
            assert a.rewind(RUN, 0, owner="trainer-a") == []  # lapsed, but nobody replaced it: still a's
            lease = b.acquire_lease(RUN, "trainer-b")
            assert (lease.owner, lease.took_over, lease.previous_owner) == ("trainer-b", False, "trainer-a")
            assert _refused(a.renew_lease, RUN, "trainer-a").code == "lease_lost"

            released = b.release_lease(RUN, "trainer-b")
            assert not released.live and released.released_at is not None
            assert b.cancel(run=RUN) == []  # no live lease: a tool may cancel a run's leftovers
            assert _refused(a.cancel, run=RUN, owner="trainer-a").code == "lease_lost"  # still b's row
            assert b.acquire_lease(RUN, "trainer-c").took_over is False
    finally:
        server.stop()


def test_a_live_lease_survives_a_server_restart(tmp_path: Path) -> None:
    """Live when the server stopped, live after its restart: the next start renews it (here after
    the first process's own deadline, a 1 s lease, has passed), not only keeps it."""
    db = str(tmp_path / "calcx.db")
    server = start_server_thread(db, KEY, run_lease_s=1.0)
    with CalcxClient(server.url, KEY) as a:
        a.acquire_lease(RUN, "trainer-a")
        acquired = time.monotonic()
    server.stop()
    while time.monotonic() < acquired + 1.5:  # past the deadline the first process stored
        time.sleep(0.05)
    server = start_server_thread(db, KEY, run_lease_s=30.0)
    try:
        with CalcxClient(server.url, KEY) as b:
            assert _refused(b.acquire_lease, RUN, "trainer-b").code == "run_leased"
    finally:
        server.stop()


def test_the_lease_table_is_bounded_and_ended_leases_make_room(tmp_path: Path) -> None:
    server: ServerThread = start_server_thread(str(tmp_path / "calcx.db"), KEY, max_run_leases=2)
    try:
        with CalcxClient(server.url, KEY) as c:
            c.acquire_lease("r1", "t1")
            c.acquire_lease("r2", "t2")
            err = _refused(c.acquire_lease, "r3", "t3")
            assert (err.status, err.code) == (409, "lease_limit") and "--max-run-leases 2" in err.message
            c.release_lease("r1", "t1")
            assert c.acquire_lease("r3", "t3").live  # r1's ended lease made room
            assert _refused(c.acquire_lease, "r4", "t4").code == "lease_limit"
            assert c.acquire_lease("r2", "t2").live  # a holder taking its own run again needs no room
    finally:
        server.stop()


def test_a_restart_renews_only_recent_leases_and_retention_prunes_ended_ones(tmp_path: Path) -> None:
    """Clocks injected: a lease renewed more than one lease length before a restart stays ended
    (a dead trainer's restart needs no take-over); ended leases older than retention go."""
    from calcx.server.store import RolloutStore
    from calcx.server.store.database import LeaseHeld

    wall, mono = [1_000_000.0], [50.0]
    path = str(tmp_path / "clocks.db")
    store = RolloutStore(path, clock=lambda: wall[0], monotonic=lambda: mono[0])
    store.leases.acquire("recent", "t1", False, 30.0, 10)
    store.leases.acquire("stale", "t2", False, 30.0, 10)
    wall[0] += 40
    mono[0] += 40
    store.leases.renew("recent", "t1", 30.0, 10)
    store.close()
    mono[0] = 5.0  # a reboot restarted the monotonic clock
    wall[0] += 10
    store = RolloutStore(path, clock=lambda: wall[0], monotonic=lambda: mono[0])
    assert store.leases.renew_after_restart(30.0) == 1
    assert store.leases.acquire("stale", "t3", False, 30.0, 10)["previous_owner"] == "t2"  # no take-over needed
    with pytest.raises(LeaseHeld, match="held by trainer 't1'"):
        store.leases.acquire("recent", "t4", False, 30.0, 10)
    store.leases.release("stale", "t3", 30.0)
    wall[0] += 8 * 24 * 3600
    mono[0] += 8 * 24 * 3600  # "recent" lapsed too, long ago
    store.retention.prune(7 * 24 * 3600)
    assert [row[0] for row in store._db.execute("SELECT run FROM run_leases")] == []
    store.close()
