"""`calcx controller --runner k8s` as a process, against a real calcx server and the loopback
Kubernetes API double (`fake_apiserver`, through the real `kubernetes` client): it claims
rollouts, creates each Job with its attempt key in a Secret (never plain env), reports outcomes;
an image-pull failure is reported as `image_pull` at once, and a slow but legitimate pull
(ContainerCreating) is not mistaken for one: it runs until the rollout's deadline (`timeout`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_apiserver import FakeApiServer

import calcx
from calcx.api.client import CalcxClient
from calcx.api.models import Rollout
from calcx.api.tokens import attempt_token
from calcx.contract.ready import CONTROLLER_READY
from calcx.k8s.render import SECRET_KEY_NAME
from calcx.procs.managed import ManagedProcess
from calcx.server.serve import ServerThread, start_server_thread

KEY = "k8s-controller-process-key-0123456789"
SRC = str(Path(calcx.__file__).resolve().parents[1])


@pytest.fixture()
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[ServerThread]:
    thread = start_server_thread(str(tmp_path / "calcx.db"), KEY, lease_s=30.0)
    try:
        yield thread
    finally:
        thread.stop()


@pytest.fixture()
def client(server: ServerThread) -> Iterator[CalcxClient]:
    with CalcxClient(server.url, KEY, timeout=60.0) as c:
        yield c


def start_controller(api: FakeApiServer, server: ServerThread, tmp_path: Path, image: str) -> ManagedProcess:
    name = image.split(":")[-1]
    kubeconfig = api.kubeconfig(str(tmp_path / f"{name}.kubeconfig"))
    paths = [SRC, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "CALCX_KEY": KEY}
    cmd = [
        sys.executable,
        "-m",
        "calcx.controller",
        "--runner",
        "k8s",
        "--server",
        server.url,
        "--controller-id",
        f"ctl-{name}",
        "--concurrency",
        "4",
        "--agent-image",
        image,
        "--kubeconfig",
        kubeconfig,
        "--namespace",
        "calcx",
        "--max-jobs-per-s",
        "50",
    ]
    return ManagedProcess(f"controller-{name}", cmd, tmp_path / f"controller-{name}.log", env).start(
        CONTROLLER_READY, 120.0
    )


def run_rollouts(client: CalcxClient, ids: list[str], *, deadline_s: float) -> dict[str, Rollout]:
    client.create_rollouts(
        [
            {
                "rollout_id": rid,
                "row": {"question": f'What is {i} + 2? It\'s "{rid}": really', "result": str(i + 2)},
                "deadline_s": deadline_s,
                "max_attempts": 1,
            }
            for i, rid in enumerate(ids)
        ]
    )
    out = {}
    for rid in ids:
        rollout = client.wait(rid, timeout_s=60.0)
        while not rollout.is_terminal:
            rollout = client.wait(rid, timeout_s=60.0)
        out[rid] = rollout
    return out


def run_one_under(
    api: FakeApiServer,
    server: ServerThread,
    client: CalcxClient,
    tmp_path: Path,
    image: str,
    rid: str,
    *,
    deadline_s: float,
) -> Rollout:
    """One rollout under a controller of `image`, which must then exit cleanly."""
    controller = start_controller(api, server, tmp_path, image)
    try:
        return run_rollouts(client, [rid], deadline_s=deadline_s)[rid]
    finally:
        assert controller.stop(grace_s=20) == 0


def env_of(job: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_controller_runs_rollouts_as_jobs_with_the_key_in_a_secret(
    api: FakeApiServer, server: ServerThread, client: CalcxClient, tmp_path: Path
) -> None:
    controller = start_controller(api, server, tmp_path, "fake/agent:ok")
    try:
        ids = [f"k8s-ok-{i}" for i in range(3)]
        done = run_rollouts(client, ids, deadline_s=60)
        assert {rid: (r.state, r.latest_attempt.controller_id) for rid, r in done.items()} == {
            rid: ("SUCCEEDED", "ctl-ok") for rid in ids
        }

        jobs = [api.get("job", name) for name in api.names("job")]
        by_rollout = {env_of(job)["QUESTION"]["value"]: job for job in jobs if job is not None}
        assert len(by_rollout) == 3
        for i, rid in enumerate(ids):
            job = by_rollout[f'What is {i} + 2? It\'s "{rid}": really']  # the question verbatim
            env = env_of(job)
            assert env["RESULT"]["value"] == str(i + 2)
            ref = env["AGL_KEY"]["valueFrom"]["secretKeyRef"]
            secret = api.get("secret", ref["name"])
            assert secret is not None and ref["key"] == SECRET_KEY_NAME
            # the attempt's own token, signed with the server's key, only in the Secret
            token = attempt_token(KEY, rid, "1", done[rid].latest_attempt.token_nonce or "")
            assert secret["stringData"] == {SECRET_KEY_NAME: token}
            assert all("value" not in e or e["value"] != token for e in env.values())
            assert f"/v1/rollouts/{rid}/attempts/1" in env["AGL_EVENT_URL"]["value"]
            assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 60
    finally:
        assert controller.stop(grace_s=20) == 0
    assert api.names("job") == [] and api.names("secret") == []  # it removes what it created


def test_image_pull_failure_is_reported_as_such(
    api: FakeApiServer, server: ServerThread, client: CalcxClient, tmp_path: Path
) -> None:
    rollout = run_one_under(api, server, client, tmp_path, "fake/agent:image-pull", "k8s-pull", deadline_s=120)
    attempt = rollout.latest_attempt
    assert (rollout.state, attempt.reason) == ("FAILED", "image_pull")
    assert "ErrImagePull" in (attempt.detail or "") or "pull access denied" in (attempt.detail or "")


def test_a_slow_pull_is_not_mistaken_for_an_image_pull_failure(
    api: FakeApiServer, server: ServerThread, client: CalcxClient, tmp_path: Path
) -> None:
    rollout = run_one_under(api, server, client, tmp_path, "fake/agent:slow-pull", "k8s-slow-pull", deadline_s=2)
    attempt = rollout.latest_attempt
    # waited through ContainerCreating until the Job's own deadline ended it
    assert (rollout.state, attempt.reason) == ("FAILED", "timeout")
    assert "DeadlineExceeded" in (attempt.detail or "")
