"""The Kubernetes runner: one Job per rollout attempt, watched to a terminal state.

For each claim it renders the Job and a per-attempt Secret (holding the attempt token, read by
the Job as `AGL_KEY` through `secretKeyRef`) from `src/k8s/templates`, creates the Secret, then
the Job, then makes the Job the Secret's owner so Kubernetes deletes both together. Two
background threads (`k8s_watch`) watch this controller's Jobs and Pods and hand each object to
the event loop, which maps it to an outcome (`k8s_outcomes`: Complete, Failed, deadline, image
pull, config error).

Job creation is rate-limited by a token bucket (`token_bucket`); `k8s_cli` builds the runner
from `calcx controller --runner k8s`'s flags. `close()` deletes every Job and Secret this
runner created (propagationPolicy Background).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException

from calcx.contract.env import (
    CALCX_AGENT_TIMEOUT_S,
    CALCX_ATTEMPT_ID,
    CALCX_ROLLOUT_ID,
)
from calcx.contract.failures import FailureReason
from calcx.controller.base import RunResult
from calcx.controller.k8s_outcomes import (
    AGENT_CONTAINER,
    agent_container_status,
    classify_finished_job,
    classify_pod_waiting,
    clip_detail,
    job_is_finished,
    object_name,
)
from calcx.controller.k8s_watch import JobPodWatches
from calcx.controller.token_bucket import TokenBucket
from calcx.k8s.escaping import label_value
from calcx.k8s.render import MANAGED_BY, JobSettings, RenderedAttempt, RenderError, render_attempt

log = logging.getLogger("calcx.controller.k8s")


@dataclass(frozen=True)
class K8sRunnerConfig:
    """Where and how the runner creates Jobs. `kubeconfig=None` and `in_cluster=None`: in-cluster
    config when running in a pod, else the default kubeconfig."""

    job: JobSettings = field(default_factory=JobSettings)
    kubeconfig: str | None = None
    in_cluster: bool | None = None
    max_jobs_per_s: float = 5.0
    burst: int = 10
    deadline_grace_s: float = 30.0
    agent_timeout_margin_s: float = 5.0
    watch_timeout_s: int = 60
    request_timeout_s: float = 30.0
    api_threads: int = 16
    # (name, value) of agent settings every Job gets from the controller's own environment (a Job
    # inherits nothing else of it): CALCX_AGENT_TOOL_ROUNDS and CALCX_AGENT_PROMPT, as the trainer's run was composed
    agent_settings: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not (self.max_jobs_per_s > 0 and math.isfinite(self.max_jobs_per_s)):
            raise ValueError(f"max_jobs_per_s must be a positive number, got {self.max_jobs_per_s!r}")
        if self.burst < 1:
            raise ValueError(f"burst must be at least 1, got {self.burst!r}")


# --- the runner --------------------------------------------------------------------------------


@dataclass
class _Tracked:
    rendered: RenderedAttempt
    future: asyncio.Future[tuple[str, Any]]
    pod: k8s.V1Pod | None = None


class K8sRunner:
    """Runs each claimed attempt as a Kubernetes Job (see the module docstring)."""

    name = "k8s"

    def __init__(self, config: K8sRunnerConfig | None = None, *, api_client: k8s.ApiClient | None = None) -> None:
        self.config = config or K8sRunnerConfig()
        self._api_client = api_client
        self._core: k8s.CoreV1Api | None = None
        self._batch: k8s.BatchV1Api | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._bucket = TokenBucket(self.config.max_jobs_per_s, self.config.burst)
        self._tracked: dict[str, _Tracked] = {}
        self._created_jobs: set[str] = set()
        self._stopping = threading.Event()
        self._watches: JobPodWatches | None = None
        self._runs: set[asyncio.Task[Any]] = set()
        self.selector = (
            f"app.kubernetes.io/managed-by={MANAGED_BY},"
            f"calcx.dev/controller={label_value(self.config.job.controller_id)}"
        )

    # -- lifecycle --

    def _load_client(self) -> k8s.ApiClient:
        if self._api_client is not None:
            return self._api_client
        configuration = k8s.Configuration()
        in_cluster = self.config.in_cluster
        if in_cluster is None:
            in_cluster = self.config.kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ
        try:
            if in_cluster:
                k8s_config.load_incluster_config(client_configuration=configuration)
            else:
                k8s_config.load_kube_config(config_file=self.config.kubeconfig, client_configuration=configuration)
        except k8s_config.ConfigException as exc:
            where = (
                "in-cluster service account"
                if in_cluster
                else f"kubeconfig {self.config.kubeconfig or '~/.kube/config'}"
            )
            raise RuntimeError(f"k8s runner: cannot load Kubernetes credentials from the {where}: {exc}") from exc
        configuration.connection_pool_maxsize = self.config.api_threads + 4
        self._api_client = k8s.ApiClient(configuration)
        return self._api_client

    @property
    def _core_v1(self) -> k8s.CoreV1Api:
        assert self._core is not None, "start() makes the API objects"
        return self._core

    @property
    def _batch_v1(self) -> k8s.BatchV1Api:
        assert self._batch is not None, "start() makes the API objects"
        return self._batch

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._pool = ThreadPoolExecutor(self.config.api_threads, thread_name_prefix="calcx-k8s-api")
        api_client = await self._call(self._load_client)
        self._core = k8s.CoreV1Api(api_client)
        self._batch = k8s.BatchV1Api(api_client)
        namespace = self.config.job.namespace
        try:  # fail at start, with the reason, rather than on the first rollout
            await self._call(
                self._batch.list_namespaced_job, namespace, limit=1, _request_timeout=self.config.request_timeout_s
            )
        except ApiException as exc:
            raise RuntimeError(
                f"k8s runner: cannot list Jobs in namespace {namespace!r} ({exc.status} {exc.reason}); "
                "check the namespace exists and the RBAC Role from src/k8s is bound to this account"
            ) from exc
        self._watches = JobPodWatches(
            {"job": self._batch.list_namespaced_job, "pod": self._core.list_namespaced_pod},
            namespace,
            self.selector,
            watch_timeout_s=self.config.watch_timeout_s,
            request_timeout_s=self.config.request_timeout_s,
            stopping=self._stopping,
        )
        self._watches.start(self._loop, self._on_object)
        log.info(
            "k8s runner: namespace %s, image %s, %s Jobs/s",
            namespace,
            self.config.job.image,
            self.config.max_jobs_per_s,
        )

    async def close(self) -> None:
        self._stopping.set()
        if self._watches is not None:
            self._watches.stop()
        for tracked in self._tracked.values():
            if not tracked.future.done():
                tracked.future.set_result(("cancelled", None))
        runs = {t for t in self._runs if t is not asyncio.current_task()}
        if runs:  # let runs in the middle of creating finish, so their objects get deleted too
            await asyncio.wait(runs, timeout=self.config.request_timeout_s + 5)
        if self._batch is not None:
            # each Secret is owned by its Job: the garbage collector deletes it with the Job
            await asyncio.gather(*(self._delete_job(name) for name in sorted(self._created_jobs)))
        if self._watches is not None:
            await self._watches.join()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self._api_client is not None:
            self._api_client.close()

    # -- one attempt --

    def _attempt_settings(self, claim: Any) -> dict[str, str]:
        env = dict(claim.env)
        env.setdefault(CALCX_ROLLOUT_ID, claim.rollout.rollout_id)
        env.setdefault(CALCX_ATTEMPT_ID, claim.attempt_id)
        # The agent stops itself (exit 12, reason timeout) just before Kubernetes would kill it.
        agent_timeout = max(1.0, float(claim.deadline_s) - self.config.agent_timeout_margin_s)
        env.setdefault(CALCX_AGENT_TIMEOUT_S, f"{agent_timeout:g}")
        for name, value in self.config.agent_settings:
            env.setdefault(name, value)
        return env

    def render(self, claim: Any) -> RenderedAttempt:
        """The Job and Secret this runner would create for `claim` (also used by tests and tools)."""
        return render_attempt(
            rollout_id=claim.rollout.rollout_id,
            attempt_id=claim.attempt_id,
            group_id=claim.rollout.group_id,
            env=self._attempt_settings(claim),
            token=claim.token,
            deadline_s=float(claim.deadline_s),
            settings=self.config.job,
        )

    async def run(self, claim: Any) -> RunResult:
        if self._batch is None or self._loop is None:
            raise RuntimeError("K8sRunner.run() before start()")
        try:
            rendered = self.render(claim)
        except RenderError as exc:
            return RunResult.failed(FailureReason.BAD_ENVIRONMENT, detail=clip_detail(f"cannot render the Job: {exc}"))
        started = time.monotonic()
        tracked = _Tracked(rendered, self._loop.create_future())
        self._tracked[rendered.job_name] = tracked
        task = asyncio.current_task()
        if task is not None:
            self._runs.add(task)
        try:
            await self._bucket.acquire()
            if self._stopping.is_set():
                return RunResult.failed(FailureReason.CANCELLED, detail="runner closed before the Job was created")
            failure = await self._create(rendered)
            if failure is not None:
                return failure
            if self._stopping.is_set():
                await self._delete_job(rendered.job_name)
                return RunResult.failed(
                    FailureReason.CANCELLED, detail=f"job {rendered.job_name}: runner closed; deleted"
                )
            limit = float(claim.deadline_s) + self.config.deadline_grace_s
            try:
                kind, payload = await asyncio.wait_for(asyncio.shield(tracked.future), limit)
            except asyncio.TimeoutError:
                await self._delete_job(rendered.job_name)
                return RunResult.failed(
                    FailureReason.TIMEOUT,
                    agent_seconds=time.monotonic() - started,
                    detail=f"job {rendered.job_name} not finished {limit:.0f} s after creation; deleted",
                )
            if kind == "fast":
                await self._delete_job(rendered.job_name)
                return payload
            if kind == "cancelled":
                return RunResult.failed(
                    FailureReason.CANCELLED, detail=f"job {rendered.job_name}: {payload or 'runner closed'}"
                )
            return await self._finished(payload, tracked)
        except asyncio.CancelledError:
            await asyncio.shield(self._delete_job(rendered.job_name))
            raise
        finally:
            self._tracked.pop(rendered.job_name, None)
            self._runs.discard(task)

    async def _create(self, rendered: RenderedAttempt) -> RunResult | None:
        """The Job, suspended; then its Secret, owned by the Job from the start (the runner needs no
        patch or delete on Secrets: a patch answers with a Secret's data); then the Job resumed."""
        ns = self.config.job.namespace
        timeout = self.config.request_timeout_s
        try:
            job = await self._call(self._batch_v1.create_namespaced_job, ns, rendered.job, _request_timeout=timeout)
        except ApiException as exc:
            if exc.status != 409:
                reason = FailureReason.CONFIG_ERROR if exc.status in (400, 403, 422) else FailureReason.CRASH
                return RunResult.failed(
                    reason,
                    detail=clip_detail(f"cannot create Job {rendered.job_name}: {exc.status} {exc.reason}: {exc.body}"),
                )
            # the attempt is already there (controller restart): follow it, resuming it if it never was
            job = await self._call(self._batch_v1.read_namespaced_job, rendered.job_name, ns, _request_timeout=timeout)
        self._created_jobs.add(rendered.job_name)
        owner = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": job.metadata.name,
            "uid": job.metadata.uid,
            "blockOwnerDeletion": False,
            "controller": False,
        }
        secret = {**rendered.secret, "metadata": {**rendered.secret["metadata"], "ownerReferences": [owner]}}
        try:
            await self._call(self._core_v1.create_namespaced_secret, ns, secret, _request_timeout=timeout)
        except ApiException as exc:
            if exc.status != 409:  # 409: a previous try of this attempt made it; its token is the same
                await self._delete_job(rendered.job_name)
                return RunResult.failed(
                    FailureReason.CONFIG_ERROR,
                    detail=clip_detail(
                        f"cannot create Secret {rendered.secret_name}: {exc.status} {exc.reason}: {exc.body}"
                    ),
                )
        if job.spec is not None and job.spec.suspend:
            try:
                job = await self._call(
                    self._batch_v1.patch_namespaced_job,
                    rendered.job_name,
                    ns,
                    {"spec": {"suspend": False}},
                    _request_timeout=timeout,
                )
            except ApiException as exc:
                await self._delete_job(rendered.job_name)
                return RunResult.failed(
                    FailureReason.CONFIG_ERROR,
                    detail=clip_detail(f"cannot resume Job {rendered.job_name}: {exc.status} {exc.reason}: {exc.body}"),
                )
        if job_is_finished(job):
            self._on_object("job", "ADDED", job)
        return None

    async def _finished(self, job: k8s.V1Job, tracked: _Tracked) -> RunResult:
        """Outcome of a finished Job, reading its Pod (and log tail) when the watch has not."""
        pod = tracked.pod
        status = agent_container_status(pod)
        if status is None or status.state is None or status.state.terminated is None:
            pod = await self._latest_pod(tracked.rendered.job_name) or pod
        result = classify_finished_job(job, pod)
        if result.state == "FAILED" and result.exit_code not in (None, 0) and pod is not None:
            status = agent_container_status(pod)
            terminated = status.state.terminated if status is not None and status.state is not None else None
            if not (terminated and terminated.message):
                tail = await self._log_tail(object_name(pod))
                if tail:
                    result = classify_finished_job(job, pod, tail)
        return result

    async def _latest_pod(self, job_name: str) -> k8s.V1Pod | None:
        try:
            pods = await self._call(
                self._core_v1.list_namespaced_pod,
                self.config.job.namespace,
                label_selector=f"job-name={job_name}",
                _request_timeout=self.config.request_timeout_s,
            )
        except ApiException:
            return None
        items = sorted(pods.items or [], key=lambda p: p.metadata.creation_timestamp or datetime.min)
        return items[-1] if items else None

    async def _log_tail(self, pod_name: str) -> str | None:
        try:
            return await self._call(
                self._core_v1.read_namespaced_pod_log,
                pod_name,
                self.config.job.namespace,
                container=AGENT_CONTAINER,
                tail_lines=20,
                _request_timeout=self.config.request_timeout_s,
            )
        except ApiException:
            return None

    async def _delete_job(self, name: str) -> None:
        try:
            await self._call(
                self._batch_v1.delete_namespaced_job,
                name,
                self.config.job.namespace,
                propagation_policy="Background",
                _request_timeout=self.config.request_timeout_s,
            )
        except ApiException as exc:
            if exc.status != 404:
                log.warning("k8s runner: cannot delete Job %s: %s %s", name, exc.status, exc.reason)
                return
        except Exception as exc:  # noqa: BLE001 - cleanup must go on
            log.warning("k8s runner: cannot delete Job %s: %s", name, exc)
            return
        self._created_jobs.discard(name)

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    # -- what the watches report (on the event loop) --

    def _on_object(self, kind: str, event: str, obj: Any) -> None:
        """Runs on the event loop: route a Job or Pod to the attempt it belongs to."""
        if kind == "job":
            tracked = self._tracked.get(obj.metadata.name)
            if tracked is None or tracked.future.done():
                return
            if event == "DELETED" and not job_is_finished(obj):
                tracked.future.set_result(("cancelled", "Job deleted before it finished"))
            elif job_is_finished(obj):
                tracked.future.set_result(("job", obj))
            return
        labels = obj.metadata.labels or {}
        job_name = labels.get("batch.kubernetes.io/job-name") or labels.get("job-name")
        tracked = self._tracked.get(job_name) if job_name else None
        if tracked is None or tracked.future.done():
            return
        if event != "DELETED":
            tracked.pod = obj
        fast = classify_pod_waiting(obj)
        if fast is not None:
            tracked.future.set_result(("fast", fast))
