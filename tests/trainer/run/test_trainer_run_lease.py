"""Two `calcx train`s of one run name against one real server: the second start is refused (the
run, the holder and when its lease lapses named) and touches nothing of the live run, unless it
takes the run over; the first is then fenced off (its ledger records refused) and its keeper stops
it. A killed trainer's lease lapses and the restart takes it without a take-over; a clean end
releases it at once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from live_stack import needs_services, start_server

from calcx.api.client import CalcxAPIError, CalcxClient
from calcx.contract.labels import RUN_LABEL
from calcx.trainer.run.run_lease import LeaseKeeper, RunLeaseRefused, take_run_lease
from calcx.trainer.workers.ledger import record_step

pytestmark = needs_services

KEY = "run-lease-trainer-key-0123456789abcdef"
RUN = "calcx-grpo"


def _succeeded(client: CalcxClient, rid: str) -> None:
    client.create_rollout({"rollout_id": rid, "row": {"question": "q", "result": "1"}, "labels": {RUN_LABEL: RUN}})
    (claim,) = client.claim("ctl", 1, timeout_s=2).claims
    client.post_reward(rid, claim.attempt_id, 1.0)
    client.finish(rid, claim.attempt_id, "SUCCEEDED")


def test_a_second_trainer_is_refused_until_it_takes_over_and_the_first_is_fenced(tmp_path: Path) -> None:
    server, url = start_server(tmp_path, KEY, "--run-lease-s", "0.6")
    lost: list[str] = []
    try:
        with CalcxClient(url, KEY) as first, CalcxClient(url, KEY) as second:
            keeper = LeaseKeeper(first, take_run_lease(first, RUN, "trainer-a", wait_s=0), lost.append).start()
            _succeeded(first, "s1")
            assert record_step(first, RUN, 1, ["s1"], owner="trainer-a") == 1
            time.sleep(1.5)  # past two lease lengths: the keeper renews
            with pytest.raises(RunLeaseRefused) as refused:
                take_run_lease(second, RUN, "trainer-b", wait_s=1.0)  # waits, the lease is renewed meanwhile
            message = str(refused.value)
            assert f"run {RUN!r}" in message and "'trainer-a'" in message and "lapses at" in message
            assert "--take-over" in message

            taken = take_run_lease(second, RUN, "trainer-b", take_over=True, wait_s=0)
            assert (taken.took_over, taken.previous_owner) == (True, "trainer-a")
            deadline = time.monotonic() + 10
            while not lost and time.monotonic() < deadline:
                time.sleep(0.05)
            assert lost and "'trainer-b'" in lost[0]  # the keeper saw it at its next renewal
            _succeeded(first, "s2")
            with pytest.raises(CalcxAPIError) as fenced:
                record_step(first, RUN, 2, ["s2"], owner="trainer-a", sleep=lambda s: None)
            assert (fenced.value.status, fenced.value.code) == (409, "lease_lost")
            keeper.stop()  # lost: nothing to release
            assert second.renew_lease(RUN, "trainer-b").owner == "trainer-b"
    finally:
        server.stop()


def test_a_killed_trainers_lease_lapses_and_a_clean_end_releases_it(tmp_path: Path) -> None:
    server, url = start_server(tmp_path, KEY, "--run-lease-s", "0.5")
    try:
        with CalcxClient(url, KEY) as client:
            take_run_lease(client, RUN, "killed", wait_s=0)  # never renewed: its trainer was SIGKILLed
            started = time.monotonic()
            restarted = take_run_lease(client, RUN, "restart", wait_s=10)
            assert (restarted.owner, restarted.took_over) == ("restart", False)
            assert time.monotonic() - started < 5

            keeper = LeaseKeeper(client, restarted, lambda message: None).start()
            keeper.stop()  # the run ended
            assert take_run_lease(client, RUN, "next", wait_s=0).owner == "next"  # at once, no take-over
    finally:
        server.stop()


def test_calcx_trains_services_step_takes_the_lease_before_it_cancels_anything(tmp_path: Path) -> None:
    """rollout_services (what `calcx train` runs before verl) of a second trainer: refused while the
    first holds the run, its leftover cancel never sent; with take_over, it cancels and the first's
    keeper is told."""
    from calcx.trainer.config.compose import ComposeRequest, compose
    from calcx.trainer.run.launch import LaunchError, rollout_services

    server, url = start_server(tmp_path, KEY)
    lost: list[str] = []
    try:
        cfg = compose(
            ComposeRequest(
                model="calcx-stub",
                run_name=RUN,
                gpu_memory_gib=0,
                dotlist=[
                    f"calcx.server_url={url}",
                    "calcx.run_lease_wait_s=0",
                    f"trainer.default_local_dir={tmp_path / 'ckpt'}",
                ],
            )
        )
        with CalcxClient(url, KEY) as client:
            with rollout_services(cfg, tmp_path / "a", KEY, owner="trainer-a", on_lost=lost.append) as first:
                client.create_rollout(
                    {"rollout_id": "live-work", "row": {"question": "q", "result": "1"}, "labels": {RUN_LABEL: RUN}}
                )
                with pytest.raises(LaunchError) as refused:
                    with rollout_services(cfg, tmp_path / "b", KEY, owner="trainer-b"):
                        pass
                assert f"run {RUN!r} is held by trainer 'trainer-a'" in str(refused.value)
                assert client.get_rollout("live-work").state == "QUEUED"  # the live run's work untouched

                with rollout_services(cfg, tmp_path / "b", KEY, owner="trainer-b", take_over=True) as second:
                    assert second.owner == "trainer-b" and first.owner == "trainer-a"
                    assert client.get_rollout("live-work").latest_attempt.reason == "cancelled_by_api"
                    deadline = time.monotonic() + 30
                    while not lost and time.monotonic() < deadline:
                        time.sleep(0.1)
                assert lost and "'trainer-b'" in lost[0]
    finally:
        server.stop()


def test_with_its_own_server_a_second_start_is_refused_before_its_controller_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default: calcx train starts its server on the run's database, which a second start in
    the same report directory shares. The second takes no lease, so it starts no controller that
    would claim the live run's work."""
    from live_stack import SERVICES_PYTHON

    from calcx.trainer.config.compose import ComposeRequest, compose
    from calcx.trainer.run.launch import LaunchError, rollout_services
    from calcx.trainer.run.services import CALCX_SRC, LocalServices

    controllers: list[str] = []
    start_controller = LocalServices.start_controller

    def noted(self: LocalServices) -> LocalServices:
        controllers.append(self.server_url)
        return start_controller(self)

    monkeypatch.setattr(LocalServices, "start_controller", noted)
    cfg = compose(
        ComposeRequest(
            model="calcx-stub",
            run_name=RUN,
            gpu_memory_gib=0,
            dotlist=[
                "calcx.run_lease_wait_s=0",
                f"calcx.services_python={SERVICES_PYTHON}",
                f"calcx.agent_python={SERVICES_PYTHON}",
                f"calcx.services_pythonpath={CALCX_SRC}",
                f"calcx.agent_pythonpath={CALCX_SRC}",
                "calcx.controller_concurrency=1",
                "calcx.prefork=false",
                f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            ],
        )
    )
    with rollout_services(cfg, tmp_path / "report", on_lost=lambda message: None) as first:
        with pytest.raises(LaunchError, match=f"run {RUN!r} is held by trainer {first.owner!r}"):
            with rollout_services(cfg, tmp_path / "report"):
                pass
    assert controllers == [first.url]
