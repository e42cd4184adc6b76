"""A restarted `calcx train` cancels what an earlier run of its name left on the server, and
nothing else; its own rollouts carry the run label the cancel finds."""

from __future__ import annotations

from pathlib import Path

from live_stack import needs_services, start_server

from calcx.api.client import CalcxClient
from calcx.contract.labels import RUN_LABEL
from calcx.trainer.rollouts.group import GroupSpec
from calcx.trainer.rollouts.leftovers import cancel_previous_run

pytestmark = needs_services

KEY = "leftovers-test-key-0123456789abcdef0123"


def _spec(run: str, uid: str) -> GroupSpec:
    return GroupSpec(
        uid=uid,
        session_id=0,
        n=2,
        step=3,
        partition="train",
        row={"question": "1+1", "result": "2"},
        env_map=None,
        deadline_s=30.0,
        max_attempts=1,
        wait_timeout_s=2.0,
        group_timeout_s=20.0,
        run=run,
    )


def test_a_restarted_run_cancels_its_leftovers_only(tmp_path: Path) -> None:
    server, url = start_server(tmp_path, KEY)
    try:
        killed, other = _spec("calcx-grpo", "u-killed"), _spec("someone-else", "u-other")
        assert all(body["labels"][RUN_LABEL] == "calcx-grpo" for body in killed.bodies())
        with CalcxClient(url, KEY) as client:
            client.create_rollouts(killed.bodies() + other.bodies())
            client.claim("dead-controller", 1, timeout_s=2)  # one of the killed run's was running

            assert cancel_previous_run(url, KEY, "calcx-grpo") == 2
            states = {r.rollout_id: (r.state, r.attempts[-1].reason) for r in client.all_rollouts()}
            assert [states[rid] for rid in killed.rollout_ids()] == [("FAILED", "cancelled_by_api")] * 2
            assert [states[rid] for rid in other.rollout_ids()] == [("QUEUED", None)] * 2
            assert cancel_previous_run(url, KEY, "calcx-grpo") == 0
    finally:
        server.stop()
