"""Claims: atomic hand-out to concurrent controllers, long polls, the agent environment,
and the lease rule (heartbeat or the attempt fails with reason controller_lost)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from calcx.api.client import AsyncCalcxClient, CalcxAPIError, CalcxClient
from calcx.api.tokens import attempt_token
from calcx.server.serve import start_server_thread


class ThreadOutcome:
    """Runs `target` in a thread and keeps what it returned or raised, for the test's own thread:
    an exception (an assertion included) inside a plain thread is only printed as a warning."""

    def __init__(self, target: Callable[[], Any]) -> None:
        self._target = target
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=target.__name__, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._target()
        except BaseException as exc:  # handed to the main thread by result()
            self._error = exc

    def result(self) -> Any:
        """Waits for the thread; returns what the target returned or raises what it raised.
        (The targets here are bounded by their HTTP clients' own timeouts.)"""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


def spec(rid: str, i: int = 0, **extra: Any) -> dict[str, Any]:
    row = {"id": f"q{i}", "question": f"What is {i} + 1?", "chain": "", "result": str(i + 1), "source": "t"}
    return {"rollout_id": rid, "row": row, **extra}


@pytest.mark.asyncio
async def test_concurrent_claimers_never_share_a_rollout(server: Any, server_key: str) -> None:
    total = 120
    async with AsyncCalcxClient(server.url, server_key) as admin:
        got: dict[str, list[str]] = {f"ctl-{n}": [] for n in range(4)}

        async def controller(name: str) -> None:
            async with AsyncCalcxClient(server.url, server_key) as c:
                while sum(len(v) for v in got.values()) < total:
                    answer = await c.claim(name, max=3, timeout_s=0.5)
                    got[name].extend(cl.rollout.rollout_id for cl in answer.claims)

        workers = [asyncio.create_task(controller(name)) for name in got]
        for start in range(0, total, 20):
            await admin.create_rollouts([spec(f"cc-{i}", i) for i in range(start, start + 20)])
        await asyncio.wait_for(asyncio.gather(*workers), timeout=30)
        claimed = [rid for ids in got.values() for rid in ids]
        assert len(claimed) == total and len(set(claimed)) == total
        assert sum(1 for ids in got.values() if ids) >= 2, "claims should spread over the controllers"
        running = await admin.list_rollouts(state="RUNNING", limit=1000)
        assert len(running) == total


def test_claim_long_polls_and_wakes_on_create(client: CalcxClient, server: Any, server_key: str) -> None:
    started = time.monotonic()
    nothing = client.claim("idle", 5, timeout_s=0.3)
    assert nothing.claims == [] and time.monotonic() - started >= 0.28

    def create_later() -> None:
        time.sleep(0.3)
        with CalcxClient(server.url, server_key, timeout=10.0) as other:
            other.create_rollout(spec("late-1", 1))

    worker = ThreadOutcome(create_later)
    started = time.monotonic()
    woke = client.claim("waiting", 5, timeout_s=10)
    waited = time.monotonic() - started
    worker.result()  # re-raises what went wrong in the thread, here
    assert [c.rollout.rollout_id for c in woke.claims] == ["late-1"]
    assert waited < 1.5, f"claim long poll took {waited:.2f}s"


def test_claim_answers_with_token_env_and_fifo_order(client: CalcxClient, server: Any, server_key: str) -> None:
    client.create_rollouts([spec(f"o-{i}", i, deadline_s=42) for i in range(3)])
    answer = client.claim("ctl-a", 2, timeout_s=1)
    assert [c.rollout.rollout_id for c in answer.claims] == ["o-0", "o-1"]
    assert answer.lease_s > 0
    claim = answer.claims[0]
    assert claim.attempt_id == "1" and claim.deadline_s == 42
    assert claim.rollout.state == "RUNNING" and claim.rollout.attempts[0].controller_id == "ctl-a"
    nonce = claim.rollout.attempts[0].token_nonce
    assert nonce and claim.token == attempt_token(server_key, "o-0", "1", nonce)
    base = f"{server.url}/v1/rollouts/o-0/attempts/1"
    assert claim.env == {
        "QUESTION": "What is 0 + 1?",
        "RESULT": "1",
        "AGL_OPENAI_BASE_URL": f"{base}/v1",
        "AGL_EVENT_URL": f"{base}/events",
        "AGL_KEY": claim.token,
        "CALCX_ROLLOUT_ID": "o-0",
        "CALCX_ATTEMPT_ID": "1",
    }
    assert [r.rollout_id for r in client.list_rollouts(controller_id="ctl-a")] == ["o-0", "o-1"]


def test_a_rows_own_tolerance_reaches_its_agent_and_a_row_without_one_sets_none(client: CalcxClient) -> None:
    """RESULT_REL_TOL is the one variable of the default env_map whose field a row may lack."""
    client.create_rollouts(
        [{**spec("exact", 7), "row": {**spec("exact", 7)["row"], "rel_tol": 1e-9}}, spec("calc-x", 8)]
    )
    envs = {c.rollout.rollout_id: c.env for c in client.claim("ctl-t", 2, timeout_s=1).claims}
    assert envs["exact"]["RESULT_REL_TOL"] == "1e-09"
    assert "RESULT_REL_TOL" not in envs["calc-x"] and envs["calc-x"]["RESULT"] == "9"


def test_a_null_tolerance_is_none_and_one_that_is_no_tolerance_is_refused_at_create(client: CalcxClient) -> None:
    """A file mixing hard and GSM8K rows holds rel_tol null on the GSM8K ones: the agent keeps
    Calc-X's. A value the agent could not read is refused by name when the rollout is created,
    not found by the agent at every attempt."""
    row = spec("mixed", 3)["row"]
    client.create_rollouts([{"rollout_id": "mixed", "row": {**row, "rel_tol": None}}])
    assert "RESULT_REL_TOL" not in client.claim("ctl-n", 1, timeout_s=1).claims[0].env
    for n, bad in enumerate(("1%", "exact", -1, 2)):
        with pytest.raises(CalcxAPIError) as refused:
            client.create_rollouts([{"rollout_id": f"bad-{n}", "row": {**row, "rel_tol": bad}}])
        assert refused.value.status == 422
        assert "row field 'rel_tol' (as RESULT_REL_TOL) must be a relative tolerance" in refused.value.message


def test_lease_expiry_fails_attempt_with_controller_lost(tmp_path: Path, server_key: str) -> None:
    # a 2 s lease renewed every 0.25 s: eight heartbeats of margin, so a loaded machine cannot
    # lose "kept" by being slow; "lost" is never renewed and must expire
    thread = start_server_thread(str(tmp_path / "lease.db"), server_key, lease_s=2.0)
    try:
        with CalcxClient(thread.url, server_key) as client:
            client.create_rollouts([spec("kept", 1), spec("lost", 2)])
            claims = client.claim("ctl-x", 2, timeout_s=1).claims
            assert len(claims) == 2
            deadline = time.monotonic() + 4.5
            while time.monotonic() < deadline:
                beat = client.heartbeat("ctl-x", [("kept", "1")])
                assert [(a.rollout_id, a.attempt_id) for a in beat.held] == [("kept", "1")]
                time.sleep(0.25)
            assert client.get_rollout("kept").state == "RUNNING"
            lost = client.wait("lost", timeout_s=30)
            assert lost.state == "FAILED" and lost.attempts[0].reason == "controller_lost"
            assert "ctl-x" in (lost.attempts[0].detail or "")
            beat = client.heartbeat("ctl-x", [("kept", "1"), ("lost", "1")])
            assert [(a.rollout_id, a.reason) for a in beat.lost] == [("lost", "controller_lost")]
            terminal = client.terminal(after=0, timeout_s=0)
            assert [i.rollout.rollout_id for i in terminal.items] == ["lost"]
            # a late finish from the lost controller is refused; the trainer decides on a retry
            with pytest.raises(CalcxAPIError) as late:
                client.finish("lost", "1", "SUCCEEDED")
            assert late.value.status == 409
            assert client.retry("lost").state == "QUEUED"
            # heartbeat without a list extends everything the controller holds
            everything = client.heartbeat("ctl-x")
            assert [(a.rollout_id, a.attempt_id) for a in everything.held] == [("kept", "1")]
    finally:
        thread.stop()


def test_claim_for_a_vanished_long_poll_is_requeued(client: CalcxClient, server: Any, server_key: str) -> None:
    """A controller whose HTTP timeout is shorter than its long poll leaves; the rollout that
    arrives afterwards must not be stranded as RUNNING under it."""
    import httpx

    def impatient() -> httpx.Response:
        return httpx.post(
            f"{server.url}/v1/claims",
            json={"controller_id": "impatient", "max": 1, "timeout_s": 5},
            headers={"authorization": f"Bearer {server_key}"},
            timeout=0.4,
        )

    worker = ThreadOutcome(impatient)
    # The impatient client must have given up on a long poll that was still open: a timeout on
    # our side, not an answer (an empty answer would mean the server never long-polled it).
    with pytest.raises(httpx.ReadTimeout):
        answer = worker.result()
        pytest.fail(f"the impatient claim was answered instead of timing out: {answer.status_code} {answer.text}")
    time.sleep(0.1)
    client.create_rollout(spec("orphan", 1))
    time.sleep(0.3)  # the impatient long poll wakes, sees its client gone and requeues
    claims = client.claim("patient", 1, timeout_s=5).claims
    assert [c.rollout.rollout_id for c in claims] == ["orphan"]
    assert claims[0].rollout.attempts[0].controller_id == "patient"
