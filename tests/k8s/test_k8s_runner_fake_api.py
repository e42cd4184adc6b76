"""The k8s runner against `fake_apiserver` (a real HTTP server standing in for Kubernetes; see
its docstring for what it does not model), through the real `kubernetes` client."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_apiserver import FakeApiServer, Scenario, Step

from calcx.api.models import Attempt, Claim, Rollout
from calcx.api.tokens import attempt_token
from calcx.controller.base import RunResult
from calcx.controller.k8s_cli import build_runner
from calcx.controller.k8s_runner import K8sRunner, K8sRunnerConfig
from calcx.controller.token_bucket import TokenBucket
from calcx.k8s.render import SECRET_KEY_NAME, JobSettings, StaticSettings, render_static

KEY = "server-key-for-tests-0123456789-abc"
SCENARIOS = {
    "fake/agent:slow-start": Scenario([Step(0.6, "running"), Step(0.1, "exit", exit_code=0)]),
}


@pytest.fixture()
def api() -> Iterator[FakeApiServer]:
    from fake_apiserver import SCENARIOS as BASE

    with FakeApiServer(scenarios={**BASE, **SCENARIOS}) as server:
        yield server


NONCE = "feedc0de"  # what a claim's attempt would have drawn


def make_claim(rid: str, aid: str = "1", *, question: str = "What is 2+3?", deadline_s: float = 30) -> Claim:
    rollout = Rollout(
        rollout_id=rid,
        group_id="g-1",
        row={"question": question, "result": "5"},
        state="RUNNING",
        attempts=[Attempt(attempt_id=aid, state="RUNNING", created_at=0.0)],
        created_at=0.0,
        deadline_s=deadline_s,
    )
    base = f"http://127.0.0.1:9/v1/rollouts/{rid}/attempts/{aid}"
    token = attempt_token(KEY, rid, aid, NONCE)
    env = {
        "QUESTION": question,
        "RESULT": "5",
        "AGL_OPENAI_BASE_URL": f"{base}/v1",
        "AGL_EVENT_URL": f"{base}/events",
        "AGL_KEY": token,
    }
    return Claim(rollout=rollout, attempt_id=aid, token=token, env=env, deadline_s=deadline_s)


def make_runner(api: FakeApiServer, tmp_path: Path, image: str, **overrides: Any) -> K8sRunner:
    kubeconfig = api.kubeconfig(str(tmp_path / "kubeconfig"))
    settings: dict[str, Any] = {"max_jobs_per_s": 50.0, "burst": 10, "deadline_grace_s": 5.0, "watch_timeout_s": 5}
    settings.update(overrides)
    return K8sRunner(
        K8sRunnerConfig(
            job=JobSettings(namespace="calcx", image=image, controller_id="ctl-test"), kubeconfig=kubeconfig, **settings
        )
    )


def propagation(request: tuple[Any, ...]) -> str | None:
    """propagationPolicy of a recorded DELETE (query parameter or DeleteOptions body)."""
    return request[4].get("propagationPolicy") or (request[3] or {}).get("propagationPolicy")


async def run_one(runner: K8sRunner, claim: Claim, timeout: float = 20) -> RunResult:
    return await asyncio.wait_for(runner.run(claim), timeout)


def test_success_creates_a_suspended_job_then_its_owned_secret_then_resumes_and_maps_complete(
    api: FakeApiServer, tmp_path: Path
) -> None:
    async def main() -> RunResult:
        runner = make_runner(api, tmp_path, "fake/agent:ok")
        await runner.start()
        try:
            result = await run_one(runner, make_claim("r-ok"))
            job_name = runner.render(make_claim("r-ok")).job_name
            job = api.get("job", job_name)
            secret = api.get("secret", f"{job_name}-key")
            assert job is not None and secret is not None
            assert secret["stringData"] == {SECRET_KEY_NAME: attempt_token(KEY, "r-ok", "1", NONCE)}
            assert secret["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
            env = job["spec"]["template"]["spec"]["containers"][0]["env"]
            assert {
                "name": "AGL_KEY",
                "valueFrom": {"secretKeyRef": {"name": f"{job_name}-key", "key": SECRET_KEY_NAME}},
            } in env
            assert all(
                e.get("value") != attempt_token(KEY, "r-ok", "1", NONCE) for e in env
            ), "token must not be plain env"
            assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 30
            # the Job suspended first, then its Secret (owned by it from its creation), then the Job resumed
            calls = [(r[1], r[2], r[3]) for r in api.requests if r[1] in ("POST", "PATCH")]
            job_path = "/apis/batch/v1/namespaces/calcx/jobs"
            assert [(m, p) for m, p, _ in calls] == [
                ("POST", job_path),
                ("POST", "/api/v1/namespaces/calcx/secrets"),
                ("PATCH", f"{job_path}/{job_name}"),
            ]
            assert calls[0][2]["spec"]["suspend"] is True and calls[2][2] == {"spec": {"suspend": False}}
            assert calls[1][2]["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
            return result
        finally:
            await runner.close()

    result = asyncio.run(main())
    assert (result.state, result.reason, result.exit_code) == ("SUCCEEDED", None, 0)
    assert result.agent_seconds is not None and result.agent_seconds >= 0


@pytest.mark.parametrize(
    ("image", "reason", "exit_code", "detail_part"),
    [
        ("fake/agent:exit-11", "calculator_failed", 11, "calculator_failed MCP calculator died"),
        ("fake/agent:exit-13-log-only", "reward_post_failed", 13, "503 from events URL"),
        ("fake/agent:oom", "crash", 137, "OOMKilled"),
    ],
)
def test_failed_job_maps_exit_code_and_failure_line(
    api: FakeApiServer, tmp_path: Path, image: str, reason: str, exit_code: int, detail_part: str
) -> None:
    async def main() -> RunResult:
        runner = make_runner(api, tmp_path, image)
        await runner.start()
        try:
            return await run_one(runner, make_claim("r-fail"))
        finally:
            await runner.close()

    result = asyncio.run(main())
    assert (result.state, result.reason, result.exit_code) == ("FAILED", reason, exit_code)
    assert detail_part in (result.detail or "")


@pytest.mark.parametrize("image", ["fake/agent:image-pull", "fake/agent:invalid-name"])
def test_image_pull_failure_fails_fast_and_deletes_the_job(api: FakeApiServer, tmp_path: Path, image: str) -> None:
    async def main() -> tuple[RunResult, float, str]:
        runner = make_runner(api, tmp_path, image)
        await runner.start()
        try:
            started = time.monotonic()
            result = await run_one(runner, make_claim("r-pull", deadline_s=300))
            return result, time.monotonic() - started, runner.render(make_claim("r-pull", deadline_s=300)).job_name
        finally:
            await runner.close()

    result, elapsed, job_name = asyncio.run(main())
    assert (result.state, result.reason) == ("FAILED", "image_pull")
    # ~0.1 s here; 60 s is five times below the 300 s deadline it must not wait for
    assert elapsed < 60, f"image pull failure took {elapsed:.1f} s; it must not wait for the 300 s deadline"
    deletes = api.requests_of("DELETE", f"/jobs/{job_name}")
    assert deletes and propagation(deletes[0]) == "Background"
    assert api.names("job") == [] and api.names("secret") == [] and api.names("pod") == []


def test_missing_secret_is_config_error_not_a_wait(api: FakeApiServer, tmp_path: Path) -> None:
    async def main() -> RunResult:
        runner = make_runner(api, tmp_path, "fake/agent:slow-start")
        await runner.start()
        try:
            claim = make_claim("r-cfg", deadline_s=300)
            secret_name = runner.render(claim).secret_name
            task = asyncio.create_task(run_one(runner, claim))
            for _ in range(200):  # the Job resumed: its Secret exists, its container has not started
                job = api.get("job", runner.render(claim).job_name)
                if job and not job["spec"].get("suspend") and api.get("secret", secret_name):
                    break
                await asyncio.sleep(0.01)
            # Someone deletes the attempt Secret before the container starts: the kubelet cannot
            # resolve the secretKeyRef, which the runner must report at once as config_error.
            api.call(lambda: api._store("secret", "DELETED", api.objects[("secret", "calcx", secret_name)]))
            return await task
        finally:
            await runner.close()

    result = asyncio.run(main())
    assert (result.state, result.reason) == ("FAILED", "config_error")
    assert "CreateContainerConfigError" in (result.detail or "")


def test_active_deadline_maps_to_timeout(api: FakeApiServer, tmp_path: Path) -> None:
    async def main() -> RunResult:
        runner = make_runner(api, tmp_path, "fake/agent:hang")
        await runner.start()
        try:
            return await run_one(runner, make_claim("r-slow", deadline_s=1), timeout=15)
        finally:
            await runner.close()

    result = asyncio.run(main())
    assert (result.state, result.reason) == ("FAILED", "timeout")
    assert "DeadlineExceeded" in (result.detail or "")


def test_runner_deadline_backstop_when_the_cluster_never_reports(api: FakeApiServer, tmp_path: Path) -> None:
    """A Job whose deadline the cluster does not enforce still ends after deadline + grace, deleted."""
    api.enforce_deadlines = False

    async def main() -> tuple[RunResult, float, str]:
        runner = make_runner(api, tmp_path, "fake/agent:hang", deadline_grace_s=0.5)
        await runner.start()
        try:
            claim = make_claim("r-backstop", deadline_s=1)
            started = time.monotonic()
            result = await run_one(runner, claim, timeout=10)
            return result, time.monotonic() - started, runner.render(claim).job_name
        finally:
            await runner.close()

    result, elapsed, job_name = asyncio.run(main())
    assert (result.state, result.reason) == ("FAILED", "timeout")
    assert "not finished" in (result.detail or "")
    assert elapsed >= 1.4  # not before deadline (1 s) + grace (0.5 s); run_one's 10 s bounds the wait
    assert api.requests_of("DELETE", f"/jobs/{job_name}")


def test_job_creation_is_rate_limited(api: FakeApiServer, tmp_path: Path) -> None:
    async def main() -> list[RunResult]:
        runner = make_runner(api, tmp_path, "fake/agent:ok", max_jobs_per_s=5.0, burst=1)
        await runner.start()
        try:
            await run_one(runner, make_claim("r-rate-warm-up"))  # connections open; bucket refilled to 1
            return await asyncio.gather(*(run_one(runner, make_claim(f"r-rate-{i}")) for i in range(8)))
        finally:
            await runner.close()

    results = asyncio.run(main())
    assert [r.state for r in results] == ["SUCCEEDED"] * 8
    stamps = sorted(r[0] for r in api.requests_of("POST", "/namespaces/calcx/jobs"))[1:]
    assert len(stamps) == 8
    span = stamps[-1] - stamps[0]
    # 5/s with burst 1 spaces 8 creations over 1.4 s; the stamps are taken where the requests
    # arrive, so each can be late by its own latency (up to ~0.2 s seen on a loaded machine):
    # 1.0 s leaves that margin twice, and concurrent creations without the limit take ~0.1 s.
    assert span >= 1.0, f"8 Job creations within {span:.2f} s; 5/s with burst 1 needs about 1.4 s"


def test_token_bucket_allows_a_burst_then_the_rate() -> None:
    async def main() -> list[float]:
        bucket = TokenBucket(rate=20.0, burst=2)
        started = time.monotonic()
        stamps = []
        for _ in range(6):
            await bucket.acquire()
            stamps.append(time.monotonic() - started)
        return stamps

    stamps = asyncio.run(main())
    assert stamps[1] < 0.03, "the first two fit the burst"
    assert 0.18 <= stamps[-1] < 1.0, f"4 more at 20/s take about 0.2 s, took {stamps[-1]:.2f} s"


def test_close_deletes_everything_it_created(api: FakeApiServer, tmp_path: Path) -> None:
    async def main() -> RunResult:
        runner = make_runner(api, tmp_path, "fake/agent:hang")
        await runner.start()
        claims = [make_claim(f"r-close-{i}", deadline_s=60) for i in range(2)]
        tasks = [asyncio.create_task(runner.run(c)) for c in claims]
        for _ in range(300):
            if len(api.names("job")) == 2 and len(api.names("secret")) == 2:
                break
            await asyncio.sleep(0.01)
        assert len(api.names("job")) == 2
        await runner.close()
        results = await asyncio.wait_for(asyncio.gather(*tasks), 10)
        return results[0]

    result = asyncio.run(main())
    assert (result.state, result.reason) == ("FAILED", "cancelled")
    assert api.names("job") == [] and api.names("secret") == [] and api.names("pod") == []
    deletes = api.requests_of("DELETE", "/jobs/")
    assert deletes and all(propagation(d) == "Background" for d in deletes)


def test_watch_relists_after_410_gone(api: FakeApiServer, tmp_path: Path) -> None:
    async def main() -> RunResult:
        runner = make_runner(api, tmp_path, "fake/agent:ok", watch_timeout_s=1)
        await runner.start()
        try:
            first = await run_one(runner, make_claim("r-before"))
            assert first.state == "SUCCEEDED"
            api.expire_history()
            await asyncio.sleep(1.5)  # the watches reconnect from an expired resourceVersion -> 410
            return await run_one(runner, make_claim("r-after"))
        finally:
            await runner.close()

    result = asyncio.run(main())
    assert result.state == "SUCCEEDED"
    assert api.requests_of("GET", "/namespaces/calcx/jobs"), "the runner lists Jobs"


def test_hostile_question_reaches_the_job_env_verbatim(api: FakeApiServer, tmp_path: Path) -> None:
    question = 'x: "y"\n---\nkind: Secret\n# {{ 7*7 }} \\n \u2603 \U0001f600'

    async def main() -> tuple[RunResult, dict[str, Any] | None]:
        runner = make_runner(api, tmp_path, "fake/agent:ok")
        await runner.start()
        try:
            claim = make_claim("r-hostile", question=question)
            result = await run_one(runner, claim)
            return result, api.get("job", runner.render(claim).job_name)
        finally:
            await runner.close()

    result, job = asyncio.run(main())
    assert result.state == "SUCCEEDED" and job is not None
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["QUESTION"] == question


def test_a_job_gets_the_controllers_tool_rounds_and_prompt(tmp_path: Path) -> None:
    """The trainer's calcx.agent_tool_rounds and agent_prompt reach a Job's agent through the
    controller's environment, as they reach a local agent; a Job inherits nothing else of it."""

    def job_env(runner: K8sRunner) -> dict[str, Any]:
        job = runner.render(make_claim("r-rounds")).job
        return {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}

    job = JobSettings(namespace="calcx", image="fake/agent:ok", controller_id="ctl-test")
    forwarded = K8sRunner(K8sRunnerConfig(job=job, agent_settings=(("CALCX_AGENT_TOOL_ROUNDS", "8"),)))
    assert job_env(forwarded)["CALCX_AGENT_TOOL_ROUNDS"] == "8"
    assert "CALCX_AGENT_TOOL_ROUNDS" not in job_env(K8sRunner(K8sRunnerConfig(job=job)))

    args = argparse.Namespace(
        controller_id="ctl-test",
        namespace="calcx",
        agent_image="fake/agent:ok",
        image_pull_policy="IfNotPresent",
        job_ttl_s=600,
        kubeconfig=None,
        max_jobs_per_s=5.0,
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CALCX_AGENT_TOOL_ROUNDS", "3")
        assert job_env(build_runner(args))["CALCX_AGENT_TOOL_ROUNDS"] == "3"
        assert "CALCX_AGENT_PROMPT" not in job_env(build_runner(args))
        patch.setenv("CALCX_AGENT_PROMPT", "calculator-first")
        assert job_env(build_runner(args))["CALCX_AGENT_PROMPT"] == "calculator-first"
        patch.setenv("CALCX_AGENT_PROMPT", "shout")
        with pytest.raises(SystemExit, match="CALCX_AGENT_PROMPT must name one of .*plain, calculator-first.*'shout'"):
            build_runner(args)
        patch.setenv("CALCX_AGENT_PROMPT", "plain")
        patch.setenv("CALCX_AGENT_TOOL_ROUNDS", "99")
        with pytest.raises(SystemExit, match="CALCX_AGENT_TOOL_ROUNDS=99 is out of range"):
            build_runner(args)


def test_nul_in_question_fails_as_bad_environment_without_a_job(api: FakeApiServer, tmp_path: Path) -> None:
    async def main() -> RunResult:
        runner = make_runner(api, tmp_path, "fake/agent:ok")
        await runner.start()
        try:
            return await run_one(runner, make_claim("r-nul", question="2+3\x00"))
        finally:
            await runner.close()

    result = asyncio.run(main())
    assert (result.state, result.reason) == ("FAILED", "bad_environment")
    assert "NUL" in (result.detail or "")
    assert api.requests_of("POST", "/jobs") == []


def test_wrong_credentials_fail_start_with_a_clear_message(api: FakeApiServer, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "bad-kubeconfig"
    api.kubeconfig(str(kubeconfig))
    kubeconfig.write_text(kubeconfig.read_text().replace(api.token, "wrong-token"))

    async def main() -> None:
        runner = K8sRunner(
            K8sRunnerConfig(job=JobSettings(namespace="calcx", image="fake/agent:ok"), kubeconfig=str(kubeconfig))
        )
        try:
            await runner.start()
        finally:
            await runner.close()

    with pytest.raises(RuntimeError, match=r"cannot list Jobs in namespace 'calcx' \(401"):
        asyncio.run(main())


def _rbac_request(method: str, path: str, query: dict[str, str]) -> tuple[str, str, str]:
    """(apiGroup, resource, verb) that Kubernetes' RBAC checks for one API request."""
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    assert rest[0] == "namespaces", path  # the runner makes namespaced calls only
    resource, named = rest[2], len(rest) > 3
    if len(rest) > 4:
        resource = f"{resource}/{rest[4]}"
    watch = query.get("watch") in ("true", "1", "True")
    verb = {"POST": "create", "PATCH": "patch", "PUT": "update"}.get(method) or (
        ("delete" if named else "deletecollection")
        if method == "DELETE"
        else "watch" if watch else "get" if named else "list"
    )
    return group, resource, verb


def test_every_call_the_runner_makes_is_granted_by_the_shipped_role(api: FakeApiServer, tmp_path: Path) -> None:
    """The Role is the narrowest the runner needs: what a run, a failure and a close call is
    granted, and nothing else is (no reading or listing Secrets, such as the server key's)."""

    async def main() -> None:
        runner = make_runner(api, tmp_path, "fake/agent:ok")
        await runner.start()
        try:
            await run_one(runner, make_claim("r-ok"))
        finally:
            await runner.close()
        failing = make_runner(api, tmp_path, "fake/agent:exit-13-log-only")  # its detail comes from the log
        await failing.start()
        try:
            await run_one(failing, make_claim("r-11"))
        finally:
            await failing.close()

    asyncio.run(main())
    role = render_static(StaticSettings(namespace="calcx"))["role.yaml"][1]
    granted = {
        (g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }
    used = {_rbac_request(method, path, query) for _, method, path, _, query in api.requests}
    assert used <= granted, sorted(used - granted)
    # read_namespaced_job: only when the runner's deadline backstop looks at a Job the cluster never reported
    assert granted - used <= {("batch", "jobs", "get")}, f"granted but never used: {sorted(granted - used)}"
    assert {v for g, r, v in granted if r == "secrets"} == {"create"}  # a patch would answer with the data
