"""The agent image end to end: the Job the k8s runner renders for a real claimed rollout, executed
as a container of the real image by Docker (host network; image, env, user, read-only root and
the Secret-held key all taken from the rendered manifests) against a real calcx server and the
stub LLM on loopback. Proves image + template + env + key + reward path together.

Image under test: $CALCX_AGENT_IMAGE when set; otherwise the one Pants builds (src/docker:agent),
loaded from its docker-archive with the tags it names.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from calcx.api.client import CalcxClient
from calcx.api.models import Claim
from calcx.common.serving import ThreadedServer
from calcx.contract.failures import EXIT_CODES, FAILURE_PREFIX, FailureReason
from calcx.controller.k8s_runner import K8sRunner, K8sRunnerConfig
from calcx.image.build import load_archive
from calcx.k8s.render import JobSettings, RenderedAttempt
from calcx.k8s.validate import validate_manifest
from calcx.server.serve import ServerThread, start_server_thread
from calcx.stub_llm.app import create_app as create_stub_app

KEY = "docker-e2e-server-key-0123456789"
RUN_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def image(agent_archive: Path, base_image: str) -> str:
    given = os.environ.get("CALCX_AGENT_IMAGE")
    if given:
        if subprocess.run(["docker", "image", "inspect", given], capture_output=True, timeout=30).returncode != 0:
            pytest.fail(f"CALCX_AGENT_IMAGE={given} is not in the local Docker daemon")
        return given
    return load_archive(agent_archive)


@pytest.fixture()
def stub() -> Iterator[ThreadedServer]:
    with ThreadedServer(create_stub_app()) as server:
        yield server


@pytest.fixture()
def server(tmp_path: Path, stub: ThreadedServer) -> Iterator[ServerThread]:
    thread = start_server_thread(str(tmp_path / "calcx.db"), KEY)
    try:
        with CalcxClient(thread.url, KEY) as client:
            client.put_models("stub", [f"{stub.url}/v1"], policy_version=3)
        yield thread
    finally:
        thread.stop()


def claim_one(server: ServerThread, rollout_id: str, question: str, result: str) -> Claim:
    with CalcxClient(server.url, KEY) as client:
        client.create_rollout(
            {
                "rollout_id": rollout_id,
                "group_id": "docker-group",
                "deadline_s": 90,
                "row": {"question": question, "result": result},
            }
        )
        claims = client.claim("docker-e2e", max=1, timeout_s=5).claims
    assert len(claims) == 1 and claims[0].rollout.rollout_id == rollout_id
    return claims[0]


def docker_run_args(rendered: RenderedAttempt, name: str) -> list[str]:
    """`docker run` arguments that execute the rendered Job's container as the kubelet would."""
    pod = rendered.job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    security = pod["securityContext"]
    args = [
        "docker",
        "run",
        "--name",
        name,
        "--network",
        "host",
        "--pull",
        "never",
        "--user",
        f"{security['runAsUser']}:{security['runAsGroup']}",
        "--security-opt",
        "no-new-privileges",
    ]
    if container["securityContext"].get("readOnlyRootFilesystem"):
        args.append("--read-only")
    for cap in container["securityContext"]["capabilities"]["drop"]:
        args += ["--cap-drop", cap]
    for mount in container.get("volumeMounts", []):
        args += ["--tmpfs", mount["mountPath"]]
    args += ["--memory", container["resources"]["limits"]["memory"].replace("Mi", "m").replace("Gi", "g")]
    for env in container["env"]:
        if "value" in env:
            value = env["value"]
        else:
            ref = env["valueFrom"]["secretKeyRef"]
            assert ref["name"] == rendered.secret["metadata"]["name"], "the Job reads the Secret the runner creates"
            value = rendered.secret["stringData"][ref["key"]]
        args += ["--env", f"{env['name']}={value}"]
    args.append(container["image"])
    args += container.get("command", []) + container.get("args", [])
    return args


def run_container(rendered: RenderedAttempt) -> subprocess.CompletedProcess[str]:
    name = f"calcx-e2e-{uuid.uuid4().hex[:10]}"
    try:
        return subprocess.run(
            docker_run_args(rendered, name),
            capture_output=True,
            text=True,
            timeout=min(RUN_TIMEOUT_S, rendered.job["spec"]["activeDeadlineSeconds"]),
        )
    finally:
        subprocess.run(["docker", "rm", "--force", name], capture_output=True, timeout=60)


def render_for(claim: Claim, image: str) -> RenderedAttempt:
    runner = K8sRunner(K8sRunnerConfig(job=JobSettings(namespace="calcx", image=image, image_pull_policy="Never")))
    rendered = runner.render(claim)
    validate_manifest(rendered.job, source="agent Job")
    validate_manifest(rendered.secret, source="attempt Secret")
    return rendered


def outcome(server: ServerThread, rollout_id: str) -> dict[str, Any]:
    with CalcxClient(server.url, KEY) as client:
        rollout = client.get_rollout(rollout_id)
        calls = client.calls(rollout_id)
    return {"reward": rollout.reward, "calls": calls, "events": rollout.events}


def test_rendered_job_runs_in_the_image_and_posts_reward_one(image: str, server: ServerThread) -> None:
    question = 'Tom has 2 apples: he gets 3 more. "How many" now?\n# count them\n---\nWhat is 2 + 3?'
    claim = claim_one(server, "docker-e2e-right", question, "5")
    rendered = render_for(claim, image)
    assert all(e.get("value") != claim.token for e in rendered.job["spec"]["template"]["spec"]["containers"][0]["env"])

    proc = run_container(rendered)

    assert (
        proc.returncode == 0
    ), f"agent exited {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    got = outcome(server, "docker-e2e-right")
    assert got["reward"] == 1.0, f"reward {got['reward']}; stderr:\n{proc.stderr[-3000:]}"
    assert got["calls"], "the agent's model calls went through the gateway and were recorded"
    assert all(call.response_token_ids and call.policy_version == 3 for call in got["calls"])
    assert any(
        m.get("content") and "What is 2 + 3?" in str(m["content"]) for m in got["calls"][0].request["messages"]
    ), "the question arrived verbatim"


def test_wrong_answer_still_exits_zero_with_reward_zero(image: str, server: ServerThread) -> None:
    claim = claim_one(server, "docker-e2e-wrong", "What is 2 + 3?", "6")
    proc = run_container(render_for(claim, image))
    assert proc.returncode == 0, f"agent exited {proc.returncode}\nstderr:\n{proc.stderr[-3000:]}"
    assert outcome(server, "docker-e2e-wrong")["reward"] == 0.0


def test_key_of_another_attempt_is_refused(image: str, server: ServerThread) -> None:
    """The Secret-held key is what opens the attempt: another attempt's token gets no reward in."""
    claim = claim_one(server, "docker-e2e-key", "What is 2 + 3?", "5")
    other = claim_one(server, "docker-e2e-other", "What is 1 + 1?", "2")
    rendered = render_for(claim, image)
    rendered.secret["stringData"] = {k: other.token for k in rendered.secret["stringData"]}
    proc = run_container(rendered)
    last = proc.stderr.strip().splitlines()[-1]
    # refused by the gateway at the first model call, as a token of another attempt, and reported
    # as a bad environment (exit 2), not as an unreachable model or a crash
    assert proc.returncode == EXIT_CODES[FailureReason.BAD_ENVIRONMENT], f"exit {proc.returncode}: {last}"
    assert last.startswith(f"{FAILURE_PREFIX}bad_environment ") and "rejected AGL_KEY (HTTP 403)" in last, last
    assert "docker-e2e-other" in last and "not rollout 'docker-e2e-key'" in last, last
    assert outcome(server, "docker-e2e-key")["reward"] is None
