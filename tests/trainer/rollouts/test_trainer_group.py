"""settle_group against a real server: a group is trained only when every member SUCCEEDED with
a reward; one member without a reward leaves the whole group out (never trained short). And the
labels a group's rollouts carry: their partition and step, read back from the server."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from live_stack import needs_services, start_server

from calcx.api.client import AsyncCalcxClient, CalcxClient
from calcx.api.models import Rollout
from calcx.contract.failures import FailureReason
from calcx.contract.labels import RUN_LABEL
from calcx.trainer.rollouts.group import GroupSpec, RolloutOrigin, settle_group
from calcx.trainer.rollouts.rollout_samples import RolloutIncomplete

KEY = "group-test-key-0123456789abcdef0123456789"


def _spec() -> GroupSpec:
    return GroupSpec(
        uid="u1",
        session_id=0,
        n=2,
        step=1,
        partition="train",
        row={"question": "1+1", "result": "2"},
        env_map=None,
        deadline_s=30.0,
        max_attempts=1,
        wait_timeout_s=2.0,
        group_timeout_s=20.0,
    )


def _settle(tmp_path: Path, rewarded: set[int]) -> Rollout:
    """Both members claimed and finished SUCCEEDED; those in `rewarded` posted a reward first."""
    spec = _spec()
    server, url = start_server(tmp_path, KEY)
    try:
        with CalcxClient(url, KEY) as client:
            client.create_rollouts(spec.bodies())
            claims = {c.rollout.rollout_id: c for c in client.claim("ctl", 2, timeout_s=2).claims}
            for index, rid in enumerate(spec.rollout_ids()):
                if index in rewarded:
                    client.post_event(rid, claims[rid].attempt_id, "reward", {"value": 1.0})
                client.finish(rid, claims[rid].attempt_id, "SUCCEEDED")

        async def settle() -> Rollout:
            async with AsyncCalcxClient(url, KEY) as client:
                return await settle_group(client, spec)

        return asyncio.run(settle())
    finally:
        server.stop()


@needs_services
def test_a_group_whose_members_all_have_rewards_settles(tmp_path: Path) -> None:
    own = _settle(tmp_path, rewarded={0, 1})
    assert own.rollout_id == _spec().own_rollout_id() and own.reward == 1.0
    assert RolloutOrigin.of(own) == RolloutOrigin("train", 1)  # the labels it was created with, read back


@needs_services
def test_a_member_that_succeeded_without_a_reward_leaves_the_group_out(tmp_path: Path) -> None:
    with pytest.raises(RolloutIncomplete) as info:
        _settle(tmp_path, rewarded={0})
    assert info.value.reason == "group_incomplete" and "without a reward" in info.value.detail


def _settle_after(tmp_path: Path, end_first: Callable[[CalcxClient, str, str], object]) -> Rollout:
    """A group of two with two attempts each: the first attempt of member 0 ended by `end_first`
    (client, rollout id, attempt id), every other attempt run to SUCCEEDED with a reward by a
    controller stand-in while the group settles."""
    spec = replace(_spec(), max_attempts=2, group_timeout_s=15.0)
    server, url = start_server(tmp_path, KEY)
    stop = threading.Event()

    def controller() -> None:
        with CalcxClient(url, KEY) as client:
            while not stop.is_set():
                for claim in client.claim("ctl", 2, timeout_s=0.5).claims:
                    client.post_reward(claim.rollout.rollout_id, claim.attempt_id, 1.0)
                    client.finish(claim.rollout.rollout_id, claim.attempt_id, "SUCCEEDED")

    try:
        with CalcxClient(url, KEY) as client:
            client.create_rollouts(spec.bodies())
            first = spec.rollout_ids()[0]
            end_first(client, first, "1")
        worker = threading.Thread(target=controller, daemon=True)
        worker.start()

        async def settle() -> Rollout:
            async with AsyncCalcxClient(url, KEY) as client:
                return await settle_group(client, spec)

        try:
            return asyncio.run(settle())
        finally:
            stop.set()
            worker.join(timeout=10)
    finally:
        server.stop()


def _stopping_controller_cancels(client: CalcxClient, rid: str, aid: str) -> None:
    (claim,) = client.claim("stopping", 1, timeout_s=2).claims
    assert claim.rollout.rollout_id == rid
    client.finish(rid, aid, "FAILED", reason=FailureReason.CANCELLED, detail="controller stopped")


@needs_services
def test_an_attempt_a_stopping_controller_cancelled_is_retried(tmp_path: Path) -> None:
    own = _settle_after(tmp_path, _stopping_controller_cancels)
    assert own.reward == 1.0 and [a.reason for a in own.attempts] == ["cancelled", None]


@needs_services
def test_a_rollout_the_cancel_api_ended_is_not_retried_and_leaves_the_group_out(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(RolloutIncomplete) as info:
        _settle_after(tmp_path, lambda client, rid, aid: client.cancel(rollout_ids=[rid]))
    assert info.value.reason == "group_incomplete" and "cancelled_by_api" in info.value.detail
    assert time.monotonic() - started < 12  # told at once, not by the group's timeout


def _labelled(labels: dict[str, str]) -> Rollout:
    return Rollout.model_validate(
        {"rollout_id": "x", "row": {}, "state": "SUCCEEDED", "labels": labels, "attempts": [], "created_at": 1.0}
    )


def test_a_rollouts_origin_is_read_back_from_its_labels() -> None:
    origin = RolloutOrigin("train", 7)
    assert origin.labels(None) == {"partition": "train", "step": "7"}
    assert origin.labels("run-1")[RUN_LABEL] == "run-1"
    assert RolloutOrigin.of(_labelled(origin.labels("run-1"))) == origin
    assert RolloutOrigin.of(_labelled({})) is None  # not made by the trainer
    assert RolloutOrigin.of(_labelled({"step": "3"})) is None
    assert RolloutOrigin.of(_labelled({"partition": "val", "step": "7a"})) is None
    assert RolloutOrigin.of(_labelled({"partition": "val", "step": "\u0667"})) is None  # a digit, but not ASCII
