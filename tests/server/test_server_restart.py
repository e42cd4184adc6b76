"""A server killed mid-run and restarted on the same SQLite file loses nothing it acknowledged:
rollouts, attempts, events, recorded calls, the model registry and the terminal cursor."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from calcx.api.client import CalcxAPIError, CalcxClient
from calcx.server.serve import start_server_thread

SRC = str(Path(__file__).resolve().parents[2] / "src" / "python")


class ServerProcess:
    """`python -m calcx.server` in its own process group, on a free port."""

    def __init__(self, db: str, key: str, *extra: str) -> None:
        env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "CALCX_KEY": key}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "calcx.server", "--port", "0", "--db", db, "--log-level", "warning", *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        match = re.search(r"listening on (http://\S+)", line)
        if not match:
            self.kill()
            raise RuntimeError(f"server did not start: {line!r}")
        self.url = match.group(1)
        deadline = time.monotonic() + 20
        with CalcxClient(self.url, key, timeout=2) as probe:
            while True:
                try:
                    probe.health()
                    break
                except CalcxAPIError:
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        self.kill()
                        raise
                    time.sleep(0.05)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["kill", "term"])
def test_restart_mid_run_loses_nothing(tmp_path: Path, upstream: Any, server_key: str, how: int) -> None:
    db = str(tmp_path / "restart.db")
    first = ServerProcess(db, server_key)
    acked: dict[str, list[str]] = {"created": [], "claimed": [], "rewarded": [], "called": [], "finished": []}
    stop = threading.Event()
    try:
        with CalcxClient(first.url, server_key, timeout=5) as client:
            client.put_models("m", [upstream.url], policy_version=5)

            def traffic() -> None:
                i = 0
                while not stop.is_set():
                    rid = f"r-{i}"
                    try:
                        client.create_rollout(
                            {"rollout_id": rid, "group_id": f"g{i // 4}", "row": {"question": "q", "result": "1"}}
                        )
                        acked["created"].append(rid)
                        claim = client.claim("ctl", 1, timeout_s=1).claims[0]
                        acked["claimed"].append(claim.rollout.rollout_id)
                        rid, aid = claim.rollout.rollout_id, claim.attempt_id
                        client.chat_completions(
                            rid, aid, {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                        )
                        acked["called"].append(rid)
                        client.post_reward(rid, aid, 1.0)
                        acked["rewarded"].append(rid)
                        if i % 2 == 0:
                            client.finish(rid, aid, "SUCCEEDED", exit_code=0)
                            acked["finished"].append(rid)
                    except CalcxAPIError:
                        return  # the server went away mid-request: that request was not acknowledged
                    i += 1

            worker = threading.Thread(target=traffic)
            worker.start()
            deadline = time.monotonic() + 20
            while len(acked["finished"]) < 6 and time.monotonic() < deadline:
                time.sleep(0.02)
            first.kill(how)
            stop.set()
            worker.join(15)
            assert not worker.is_alive()
    finally:
        stop.set()
        first.kill()
    assert len(acked["finished"]) >= 6, acked

    second = ServerProcess(db, server_key)
    try:
        with CalcxClient(second.url, server_key, timeout=5) as client:
            assert client.get_models().endpoints == [upstream.url] and client.get_models().policy_version == 5
            for rid in acked["created"]:
                rollout = client.get_rollout(rid)
                assert rollout.group_id == f"g{int(rid.split('-')[1]) // 4}"
            for rid in acked["claimed"]:
                assert client.get_rollout(rid).attempts[0].controller_id == "ctl"
            for rid in acked["called"]:
                calls = client.calls(rid)
                assert len(calls) == 1 and calls[0].response_token_ids == [7, 8, 9] and calls[0].policy_version == 5
            for rid in acked["rewarded"]:
                assert client.get_rollout(rid).reward == 1.0
            for rid in acked["finished"]:
                assert client.get_rollout(rid).state == "SUCCEEDED"
            page = client.terminal(after=0, limit=1000, timeout_s=0)
            ids = [i.rollout.rollout_id for i in page.items]
            # the kill may fall between a commit and its answer: at most one unacknowledged extra
            assert ids[: len(acked["finished"])] == acked["finished"] and len(ids) - len(acked["finished"]) <= 1

            # RUNNING attempts survive with a fresh lease; their controller can heartbeat and finish them
            running = [r.rollout_id for r in client.list_rollouts(state="RUNNING", limit=1000)]
            assert running and len(set(running) - set(acked["claimed"])) <= 1
            beat = client.heartbeat("ctl")
            assert {a.rollout_id for a in beat.held} == set(running)
            done = client.finish(running[0], "1", "SUCCEEDED")
            assert done.state == "SUCCEEDED"
            later = client.terminal(after=page.next, timeout_s=0)
            assert [i.rollout.rollout_id for i in later.items] == [running[0]]
    finally:
        second.kill(signal.SIGTERM)


def test_a_restarted_server_process_gives_every_running_attempt_a_fresh_lease(tmp_path: Path, server_key: str) -> None:
    """The first process's lease (1 s) lapses while no server runs; the next process (lease 30 s)
    must renew it at start, before its reaper looks, not fail the attempt controller_lost."""
    db = str(tmp_path / "renew.db")
    first = ServerProcess(db, server_key, "--lease-s", "1")
    try:
        with CalcxClient(first.url, server_key, timeout=5) as client:
            client.create_rollout({"rollout_id": "l-1", "row": {"question": "q", "result": "1"}})
            claim = client.claim("ctl", 1, timeout_s=1).claims[0]
            lapsed_at = client.get_rollout("l-1").attempts[-1].lease_expires_at
    finally:
        first.kill()
    assert lapsed_at is not None
    while time.time() < lapsed_at + 0.5:  # the old lease is over before the new process starts
        time.sleep(0.05)
    restarted_at = time.time()
    second = ServerProcess(db, server_key, "--lease-s", "30")
    try:
        with CalcxClient(second.url, server_key, timeout=5) as client:
            attempt = client.get_rollout("l-1").attempts[-1]
            assert (attempt.state, attempt.reason) == ("RUNNING", None), attempt
            assert attempt.lease_expires_at is not None and attempt.lease_expires_at >= restarted_at + 20, attempt
            beat = client.heartbeat("ctl", [("l-1", claim.attempt_id)])
            assert [a.rollout_id for a in beat.held] == ["l-1"] and not beat.lost
    finally:
        second.kill(signal.SIGTERM)


def test_refuses_to_start_without_a_key(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CALCX_KEY"}
    env["PYTHONPATH"] = SRC
    result = subprocess.run(
        [sys.executable, "-m", "calcx.server", "--port", "0", "--db", str(tmp_path / "x.db")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--key-file" in result.stderr and "CALCX_KEY" in result.stderr
    assert not (tmp_path / "x.db").exists()


def test_shutdown_answers_pending_long_polls(tmp_path: Path, server_key: str) -> None:
    thread = start_server_thread(str(tmp_path / "poll.db"), server_key)
    results: dict[str, Any] = {}
    with CalcxClient(thread.url, server_key) as client:
        client.create_rollout({"rollout_id": "p-1", "row": {"question": "q", "result": "1"}})
        client.claim("ctl", 1, timeout_s=1)

        def wait() -> None:
            try:
                results["wait"] = client.wait("p-1", timeout_s=60).state
            except CalcxAPIError as exc:
                results["wait"] = exc

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.3)
        started = time.monotonic()
        thread.stop()
        waiter.join(10)
    assert not waiter.is_alive()
    # the long poll asked for 60 s: an answer within 30 s means the stop ended it (typically < 1 s)
    assert time.monotonic() - started < 30
    assert results["wait"] == "RUNNING"
    # and the data is still there for the next server on the same file
    again = start_server_thread(str(tmp_path / "poll.db"), server_key)
    try:
        with CalcxClient(again.url, server_key) as client:
            assert client.get_rollout("p-1").state == "RUNNING"
    finally:
        again.stop()


def test_a_graceful_shutdown_fails_no_running_attempt(tmp_path: Path, upstream: Any, server_key: str) -> None:
    """While the server drains in-flight requests it takes no new connection, so no heartbeat can
    arrive: a lease that lapses then is the server's doing and must not fail the attempt
    (controller_lost); the next start gives it a fresh lease."""
    db = str(tmp_path / "drain.db")
    upstream.delay_s = 3.0  # one model call in flight holds the graceful shutdown this long
    first = start_server_thread(db, server_key, lease_s=1.0, upstream_timeout_s=10.0)
    try:
        with CalcxClient(first.url, server_key, timeout=10) as client:
            client.put_models("m", [upstream.url])
            client.create_rollout({"rollout_id": "d-1", "row": {"question": "q", "result": "1"}})
            claim = client.claim("ctl", 1, timeout_s=1).claims[0]
            call = threading.Thread(
                target=lambda: client.chat_completions(
                    "d-1", claim.attempt_id, {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                )
            )
            call.start()
            while not upstream.requests:
                time.sleep(0.02)
            assert [r.rollout_id for r in client.heartbeat("ctl", [("d-1", claim.attempt_id)]).held] == ["d-1"]
            started = time.monotonic()
            first.stop()
            drained_s = time.monotonic() - started
            call.join(10)
    finally:
        first.stop()
    assert drained_s > 2.0  # the lease (1 s) lapsed while the server was draining
    # the next start renews the lapsed lease: the reaper (looking once a second at this lease) finds
    # nothing to end
    again = start_server_thread(db, server_key, lease_s=30.0)
    try:
        time.sleep(1.5)
        with CalcxClient(again.url, server_key) as client:
            attempt = client.get_rollout("d-1").attempts[-1]
            assert (attempt.state, attempt.reason) == ("RUNNING", None), attempt
    finally:
        again.stop()


def test_refuses_a_store_it_cannot_use(tmp_path: Path) -> None:
    not_a_db = tmp_path / "notes.db"
    not_a_db.write_text("these are notes, not a database " * 10)
    env = {**os.environ, "PYTHONPATH": SRC, "CALCX_KEY": "k" * 32}
    for db in (str(not_a_db), str(tmp_path / "missing-dir" / "x.db")):
        result = subprocess.run(
            [sys.executable, "-m", "calcx.server", "--port", "0", "--db", db],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 1 and "cannot use" in result.stderr and db in result.stderr
    assert not_a_db.read_text().startswith("these are notes")  # left as it was
