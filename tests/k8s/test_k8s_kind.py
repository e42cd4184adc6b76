"""The k8s runner against a real Kubernetes cluster (kind), as the users' CI runs it.

Needs: a Docker daemon that can pull `kindest/node` (or already has it), the `kind` and
`kubectl` CLIs, and the agent image ($CALCX_AGENT_IMAGE, default calcx/agent:latest). When any
of these is missing the tests skip, and the reason names every missing piece, e.g. on the
project's CI machines (no `kind` binary, no registry):
"kind cluster unavailable: the kind CLI is not installed (...); cannot pull kindest/node:v1.31.0
(no registry reachable): ...". They never pass without running.

What runs: the manifests from `calcx.k8s.build` applied with `kubectl apply -k`; real Jobs of
the real image created by `K8sRunner` through the cluster's API: the agent, given a server URL
that does not answer, exits 10 and the runner reports `model_unreachable` (the image started,
got its env and its key from the Secret); a missing image fails fast as `image_pull`; `close()`
leaves no Job or Secret behind.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

import pytest

from calcx.api.models import Attempt, Claim, Rollout
from calcx.api.tokens import attempt_token
from calcx.controller.base import RunResult
from calcx.controller.k8s_runner import K8sRunner, K8sRunnerConfig
from calcx.k8s.build import build
from calcx.k8s.render import JobSettings, StaticSettings

KIND_NODE_IMAGE = os.environ.get("CALCX_KIND_NODE_IMAGE", "kindest/node:v1.31.0")
AGENT_IMAGE = os.environ.get("CALCX_AGENT_IMAGE", "calcx/agent:latest")
PULL_TIMEOUT_S = 60
NAMESPACE = "calcx"


def _pull_problem() -> str | None:
    """None when the kind node image is present or could be pulled; else why not."""
    try:
        from testcontainers.core.docker_client import DockerClient
    except ImportError as exc:  # pragma: no cover - testcontainers is a test dependency
        return f"testcontainers is not installed ({exc})"
    try:
        client = DockerClient().client
        client.ping()
    except Exception as exc:  # noqa: BLE001
        return f"docker daemon not reachable ({type(exc).__name__}: {exc})"
    try:
        client.images.get(KIND_NODE_IMAGE)
        return None
    except Exception:  # noqa: BLE001 - not present locally: try to pull
        pass
    repository, _, tag = KIND_NODE_IMAGE.partition(":")
    pool = ThreadPoolExecutor(1)
    try:
        pool.submit(client.images.pull, repository, tag=tag or "latest").result(PULL_TIMEOUT_S)
    except FutureTimeout:
        return f"cannot pull {KIND_NODE_IMAGE}: no answer from the registry within {PULL_TIMEOUT_S} s"
    except Exception as exc:  # noqa: BLE001
        return f"cannot pull {KIND_NODE_IMAGE} (no registry reachable): {str(exc).splitlines()[0][:300]}"
    finally:
        pool.shutdown(wait=False)
    return None


def _missing_prerequisites() -> list[str]:
    """Every reason a kind cluster cannot be made here (empty when it can)."""
    problems = [
        f"the {tool} CLI is not installed (https://kind.sigs.k8s.io/docs/user/quick-start/)"
        for tool in ("kind", "kubectl")
        if shutil.which(tool) is None
    ]
    pull = _pull_problem()
    if pull:
        problems.append(pull)
    return problems


@pytest.fixture(scope="module")
def kind_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    problems = _missing_prerequisites()
    if problems:
        pytest.skip(reason="kind cluster unavailable: " + "; ".join(problems))
    name = f"calcx-test-{uuid.uuid4().hex[:6]}"
    kubeconfig = tmp_path_factory.mktemp("kind") / "kubeconfig"

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, check=True, capture_output=True, text=True, timeout=timeout)

    run(
        "kind",
        "create",
        "cluster",
        "--name",
        name,
        "--image",
        KIND_NODE_IMAGE,
        "--kubeconfig",
        str(kubeconfig),
        "--wait",
        "120s",
        timeout=400,
    )
    try:
        run("kind", "load", "docker-image", AGENT_IMAGE, "--name", name)
        out = tmp_path_factory.mktemp("manifests")
        build(
            out,
            StaticSettings(namespace=NAMESPACE, agent_image=AGENT_IMAGE),
            "kind-test-key-0123456789-abcdefghij",
            "1.31",
        )
        run("kubectl", "--kubeconfig", str(kubeconfig), "create", "namespace", NAMESPACE)
        run("kubectl", "--kubeconfig", str(kubeconfig), "apply", "-k", str(out))
        yield kubeconfig
    finally:
        subprocess.run(["kind", "delete", "cluster", "--name", name], capture_output=True, timeout=300)


def _claim(rid: str, deadline_s: float = 120) -> Claim:
    rollout = Rollout(
        rollout_id=rid,
        row={"question": "What is 2 + 3?", "result": "5"},
        state="RUNNING",
        attempts=[Attempt(attempt_id="1", state="RUNNING", created_at=0.0)],
        created_at=0.0,
    )
    base = f"http://127.0.0.1:9/v1/rollouts/{rid}/attempts/1"  # nothing listens there inside the pod
    token = attempt_token("kind-test-key-0123456789-abcdefghij", rid, "1", "feedc0de")
    env = {
        "QUESTION": "What is 2 + 3?",
        "RESULT": "5",
        "AGL_OPENAI_BASE_URL": f"{base}/v1",
        "AGL_EVENT_URL": f"{base}/events",
        "CALCX_MODEL_MAX_RETRIES": "0",
    }
    return Claim(rollout=rollout, attempt_id="1", token=token, env=env, deadline_s=deadline_s)


def _runner(kubeconfig: Path, image: str) -> K8sRunner:
    return K8sRunner(
        K8sRunnerConfig(
            job=JobSettings(
                namespace=NAMESPACE, image=image, image_pull_policy="IfNotPresent", controller_id="kind-test"
            ),
            kubeconfig=str(kubeconfig),
        )
    )


def test_real_job_of_the_real_image_maps_the_agent_exit(kind_cluster: Path) -> None:
    async def main() -> RunResult:
        runner = _runner(kind_cluster, AGENT_IMAGE)
        await runner.start()
        try:
            return await asyncio.wait_for(runner.run(_claim("kind-unreachable")), 300)
        finally:
            await runner.close()

    result = asyncio.run(main())
    assert (result.state, result.reason, result.exit_code) == ("FAILED", "model_unreachable", 10), result


def test_missing_image_fails_fast_as_image_pull(kind_cluster: Path) -> None:
    async def main() -> tuple[RunResult, float]:
        runner = _runner(kind_cluster, "calcx/agent:does-not-exist-" + uuid.uuid4().hex[:6])
        await runner.start()
        try:
            started = time.monotonic()
            result = await asyncio.wait_for(runner.run(_claim("kind-pull", deadline_s=600)), 300)
            return result, time.monotonic() - started
        finally:
            await runner.close()

    result, elapsed = asyncio.run(main())
    assert (result.state, result.reason) == ("FAILED", "image_pull")
    assert elapsed < 240


def test_close_leaves_nothing_behind(kind_cluster: Path) -> None:
    async def main() -> None:
        runner = _runner(kind_cluster, AGENT_IMAGE)
        await runner.start()
        task = asyncio.create_task(runner.run(_claim("kind-close", deadline_s=600)))
        await asyncio.sleep(3)
        await runner.close()
        await asyncio.wait_for(task, 60)

    asyncio.run(main())
    left = subprocess.run(
        [
            "kubectl",
            "--kubeconfig",
            str(kind_cluster),
            "-n",
            NAMESPACE,
            "get",
            "jobs,secrets",
            "-l",
            "app.kubernetes.io/managed-by=calcx-controller",
            "-o",
            "name",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert [name for name in left if "kind-close" in name] == []
