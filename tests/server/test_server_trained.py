"""The training ledger: a step records the SUCCEEDED rollouts it trained; a rollout is trained at
most once into a run's surviving weights; a resumed run rolls back the steps after its checkpoint,
and only then may those steps be recorded again; bad requests get a clear 4xx and change nothing."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from calcx.api.client import CalcxAPIError, CalcxClient
from calcx.contract.failures import FailureReason
from calcx.contract.labels import RUN_LABEL
from calcx.server.serve import ServerThread, start_server_thread


def _succeed(client: CalcxClient, run: str, ids: list[str]) -> None:
    client.create_rollouts(
        [{"rollout_id": rid, "row": {"question": "q", "result": "1"}, "labels": {RUN_LABEL: run}} for rid in ids]
    )
    for claim in client.claim("ctl", len(ids), timeout_s=2).claims:
        client.post_event(claim.rollout.rollout_id, claim.attempt_id, "reward", {"value": 1.0})
        client.finish(claim.rollout.rollout_id, claim.attempt_id, "SUCCEEDED")


def _refused(call, status: int, words: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CalcxAPIError) as err:
        call()
    assert err.value.status == status and words in str(err.value), str(err.value)


def _live(db_path: str) -> list[tuple[str, int, str]]:
    with sqlite3.connect(db_path) as db:
        return db.execute(
            "SELECT run, step, rollout_id FROM trained WHERE rolled_back_at IS NULL " "ORDER BY step, rollout_id"
        ).fetchall()


def test_a_rollout_is_trained_at_most_once_until_its_step_is_rolled_back(client: CalcxClient, db_path: str) -> None:
    _succeed(client, "run", ["a", "b", "c", "d"])
    assert client.record_trained("run", 1, ["a", "b", "a"]) == 2
    assert client.record_trained("run", 1, ["b", "a"]) == 2  # the same batch again: a resent request
    _refused(lambda: client.record_trained("run", 2, ["c", "a"]), 409, "already trained in step 1")
    _refused(lambda: client.record_trained("run", 1, ["c", "d"]), 409, "already recorded with another batch")
    assert client.record_trained("run", 2, ["c", "d"]) == 2
    assert _live(db_path) == [("run", 1, "a"), ("run", 1, "b"), ("run", 2, "c"), ("run", 2, "d")]

    assert client.rewind("run", 1) == [2]  # resumed from the checkpoint of step 1
    assert client.rewind("run", 1) == []
    assert _live(db_path) == [("run", 1, "a"), ("run", 1, "b")]
    _refused(lambda: client.record_trained("run", 2, ["a"]), 409, "already trained in step 1")
    assert client.record_trained("run", 2, ["d"]) == 1  # a rolled-back rollout may be trained again
    with sqlite3.connect(db_path) as db:
        assert db.execute("SELECT COUNT(*) FROM trained WHERE rolled_back_at IS NOT NULL").fetchone() == (2,)


def test_a_rewind_rolls_back_its_own_run_only(client: CalcxClient, db_path: str) -> None:
    _succeed(client, "a", ["a1", "a2"])
    _succeed(client, "b", ["b1", "b2", "b3"])
    for run in ("a", "b"):
        client.record_trained(run, 1, [f"{run}1"])
        client.record_trained(run, 2, [f"{run}2"])
    client.record_trained("b", 3, ["b3"])  # a step only run b has: the answer names a's steps alone
    assert client.rewind("a", 1) == [2]
    # run b keeps its steps 2 and 3
    assert _live(db_path) == [("a", 1, "a1"), ("b", 1, "b1"), ("b", 2, "b2"), ("b", 3, "b3")]


def test_only_a_succeeded_rollout_of_the_run_is_trained(client: CalcxClient, db_path: str) -> None:
    _succeed(client, "mine", ["ok"])
    _succeed(client, "theirs", ["other"])
    client.create_rollouts(
        [
            {
                "rollout_id": rid,
                "row": {"question": "q", "result": "1"},
                "max_attempts": 1,
                "labels": {RUN_LABEL: "mine"},
            }
            for rid in ("running", "failed")
        ]
    )
    claims = {c.rollout.rollout_id: c for c in client.claim("ctl", 2, timeout_s=2).claims}
    client.finish("failed", claims["failed"].attempt_id, "FAILED", reason=FailureReason.CRASH)
    client.create_rollouts(
        [{"rollout_id": "queued", "row": {"question": "q", "result": "1"}, "labels": {RUN_LABEL: "mine"}}]
    )
    _refused(lambda: client.record_trained("mine", 1, ["ok", "queued"]), 409, "'queued' is QUEUED")
    _refused(lambda: client.record_trained("mine", 1, ["ok", "running"]), 409, "'running' is RUNNING")
    _refused(lambda: client.record_trained("mine", 1, ["ok", "failed"]), 409, "'failed' is FAILED")
    _refused(lambda: client.record_trained("mine", 1, ["ok", "other"]), 409, "belongs to run 'theirs'")
    _refused(lambda: client.record_trained("mine", 1, ["ok", "missing"]), 404, "no rollout 'missing'")
    assert _live(db_path) == []  # a refused step records nothing, not even its good rollouts


@pytest.mark.parametrize(
    "body",
    [
        {"run": "r", "step": 1, "rollout_ids": []},
        {"run": "r", "step": -1, "rollout_ids": ["a"]},
        {"run": "", "step": 1, "rollout_ids": ["a"]},
        {"run": "r", "step": 1, "rollout_ids": ["a"] * 10_001},
        {"run": "r", "step": 1, "rollout_ids": ["a"], "extra": 1},
    ],
)
def test_a_malformed_ledger_request_is_a_422(server: ServerThread, server_key: str, db_path: str, body: dict) -> None:
    response = httpx.post(f"{server.url}/v1/trained", json=body, headers={"authorization": f"Bearer {server_key}"})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["message"]
    assert _live(db_path) == []


def test_retention_takes_a_pruned_rollouts_training_records_with_it(tmp_path: Path, server_key: str) -> None:
    server = start_server_thread(str(tmp_path / "kept.db"), server_key, retain_s=0.5, retain_check_s=0.1)
    try:
        with CalcxClient(server.url, server_key) as client:
            _succeed(client, "run", ["old"])
            assert client.record_trained("run", 1, ["old"]) == 1
            deadline = time.monotonic() + 10
            while _live(str(tmp_path / "kept.db")) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert _live(str(tmp_path / "kept.db")) == []  # the ledger is bounded by retention too
            with pytest.raises(CalcxAPIError):
                client.get_rollout("old")
    finally:
        server.stop()
