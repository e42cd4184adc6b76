"""Leases on the store with injected clocks: a claim's lease lasts exactly `lease_s` unless a
heartbeat renews it, and runs on the monotonic clock, so a wall-clock jump fails nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from calcx.api.models import RolloutCreate
from calcx.server.store import RolloutStore

LEASE_S = 30.0


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _store(tmp_path: Path) -> tuple[RolloutStore, Clock, Clock]:
    wall, mono = Clock(1_800_000_000.0), Clock(5_000.0)
    store = RolloutStore(str(tmp_path / "calcx.db"), clock=wall, monotonic=mono)
    return store, wall, mono


def _rollout(store: RolloutStore) -> dict[str, Any]:
    rollout = store.rollouts.get("r-1")
    assert rollout is not None
    return rollout


def _claimed(store: RolloutStore) -> tuple[str, str]:
    store.rollouts.create([RolloutCreate(rollout_id="r-1", row={"question": "q", "result": "1"})])
    (claim,) = store.attempts.claim("ctl", 1, LEASE_S)
    return claim


def test_a_claim_lease_lasts_lease_s_and_then_fails_controller_lost(tmp_path: Path) -> None:
    store, _, mono = _store(tmp_path)
    _claimed(store)
    mono.now += LEASE_S - 1
    assert store.attempts.expire_leases() == []
    mono.now += 2
    (expired,) = store.attempts.expire_leases()
    assert (expired.rollout_id, expired.attempt_id, expired.controller_id) == ("r-1", "1", "ctl")
    assert _rollout(store)["attempts"][-1]["reason"] == "controller_lost"


def test_a_heartbeat_renews_the_lease_for_lease_s_from_then(tmp_path: Path) -> None:
    store, _, mono = _store(tmp_path)
    claim = _claimed(store)
    mono.now += 20
    assert store.attempts.heartbeat("ctl", [claim], LEASE_S) == ([claim], [])
    mono.now += LEASE_S - 1
    assert store.attempts.expire_leases() == []
    mono.now += 2
    assert [e.rollout_id for e in store.attempts.expire_leases()] == ["r-1"]


def test_a_forward_wall_clock_jump_fails_no_running_attempt(tmp_path: Path) -> None:
    store, wall, mono = _store(tmp_path)
    _claimed(store)
    wall.now += 24 * 3600  # NTP step, a VM resumed after a day
    mono.now += 1
    assert store.attempts.expire_leases() == []
    assert _rollout(store)["state"] == "RUNNING"
    # the API shows the lease deadline as wall time, consistent with the jumped clock
    lease = _rollout(store)["attempts"][-1]["lease_expires_at"]
    assert lease == wall.now + LEASE_S - 1


def test_leases_are_renewed_at_startup_whatever_an_earlier_process_stored(tmp_path: Path) -> None:
    store, _, mono = _store(tmp_path)
    _claimed(store)
    store.close()
    # after a reboot the monotonic clock starts again near 0: the stored deadline means nothing
    wall, mono = Clock(1_800_000_100.0), Clock(10.0)
    again = RolloutStore(str(tmp_path / "calcx.db"), clock=wall, monotonic=mono)
    assert again.attempts.renew_running_leases(LEASE_S) == 1
    mono.now += LEASE_S - 1
    assert again.attempts.expire_leases() == []
    mono.now += 2
    assert len(again.attempts.expire_leases()) == 1
