"""Leases shorter than the controller's default: a rollout that runs longer than the server's
lease must survive on heartbeats from the controller's first claim on."""

from __future__ import annotations

import json
from pathlib import Path

from calcx.api.client import CalcxClient
from calcx.faults.hostile import KEY
from calcx.rehearse.stack import Stack, StackConfig


def test_first_claims_of_a_new_controller_keep_their_lease(tmp_path: Path) -> None:
    """The server's lease is 3 s and the agent needs ~5 s: the controller must heartbeat within
    lease/3 of its first claim. (It starts with a 30 s guess and sleeps 10 s before its first
    heartbeat, so these attempts fail controller_lost while the controller is alive.)"""
    question = "What is 6 * 7?"
    (tmp_path / "s.jsonl").write_text(json.dumps({"question": question, "expression": "6 * 7"}) + "\n")
    config = StackConfig(
        workdir=tmp_path,
        key=KEY,
        concurrency=2,
        script_files=[str(tmp_path / "s.jsonl")],
        server_args=["--lease-s", "3"],
    )
    with Stack(config) as stack, CalcxClient(stack.server_url, KEY, timeout=60) as client:
        client.create_rollouts(
            [
                {
                    "rollout_id": f"slow-{i}",
                    "row": {"question": f"{question} [stub:slow=2.5]", "result": "42"},
                    "deadline_s": 40,
                    "max_attempts": 1,
                }
                for i in range(2)
            ]
        )
        done = [client.wait(f"slow-{i}", timeout_s=45) for i in range(2)]
    outcomes = [(r.state, r.attempts[-1].reason, r.reward) for r in done]
    assert outcomes == [("SUCCEEDED", None, 1.0)] * 2
