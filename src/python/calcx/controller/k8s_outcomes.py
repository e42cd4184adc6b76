"""What a Kubernetes Job and its Pod mean for a rollout attempt (pure functions, no API calls).

- Job `Complete` -> SUCCEEDED (exit 0);
- Job `Failed`, reason `DeadlineExceeded` -> FAILED `timeout`;
- Job `Failed` otherwise -> the agent container's exit code through the contract's exit-code map
  (and its `calcx-agent: failure:` line, from the termination message or the log tail);
- a Pod waiting on `ErrImagePull`/`ImagePullBackOff`/`InvalidImageName` -> FAILED `image_pull`,
  `CreateContainerConfigError` -> FAILED `config_error`.
"""

from __future__ import annotations

from datetime import datetime

from kubernetes import client as k8s

from calcx.contract.failures import FailureReason, reason_from_agent_exit
from calcx.controller.base import RunResult

IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
CONFIG_REASONS = frozenset({"CreateContainerConfigError"})
AGENT_CONTAINER = "agent"
DETAIL_LIMIT = 4000


def agent_container_status(pod: k8s.V1Pod | None) -> k8s.V1ContainerStatus | None:
    if pod is None or pod.status is None:
        return None
    for status in pod.status.container_statuses or []:
        if status.name == AGENT_CONTAINER:
            return status
    return None


def object_name(obj: k8s.V1Pod | k8s.V1Job) -> str:
    """The name of a Pod or Job read from the API server, which always sends one (the client's
    models type every field as optional)."""
    assert obj.metadata is not None and obj.metadata.name is not None
    return obj.metadata.name


def clip_detail(text: str | None) -> str | None:
    """A detail for the server, its end kept (a log tail's last lines say most)."""
    if not text:
        return text
    return text if len(text) <= DETAIL_LIMIT else "..." + text[-DETAIL_LIMIT:]


def classify_pod_waiting(pod: k8s.V1Pod) -> RunResult | None:
    """FAILED image_pull / config_error when the agent container cannot start, else None."""
    status = agent_container_status(pod)
    waiting = status.state.waiting if status is not None and status.state is not None else None
    if waiting is None:
        return None
    detail = clip_detail(f"pod {object_name(pod)}: {waiting.reason}: {waiting.message or ''}".strip())
    if waiting.reason in IMAGE_PULL_REASONS:
        return RunResult.failed(FailureReason.IMAGE_PULL, detail=detail)
    if waiting.reason in CONFIG_REASONS:
        return RunResult.failed(FailureReason.CONFIG_ERROR, detail=detail)
    return None


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return max(0.0, (end - start).total_seconds())


def _condition(job: k8s.V1Job, kind: str) -> k8s.V1JobCondition | None:
    for cond in (job.status.conditions if job.status else None) or []:
        if cond.type == kind and cond.status == "True":
            return cond
    return None


def job_is_finished(job: k8s.V1Job) -> bool:
    return _condition(job, "Complete") is not None or _condition(job, "Failed") is not None


def classify_finished_job(job: k8s.V1Job, pod: k8s.V1Pod | None, log_tail: str | None = None) -> RunResult:
    """The outcome of a Job with a Complete or Failed condition, given its (last) Pod."""
    status = agent_container_status(pod)
    terminated = status.state.terminated if status is not None and status.state is not None else None
    seconds = _seconds(terminated.started_at, terminated.finished_at) if terminated else None
    if _condition(job, "Complete") is not None:
        return RunResult.succeeded(exit_code=0, agent_seconds=seconds)
    failed = _condition(job, "Failed")
    assert failed is not None, "classify_finished_job needs a finished Job"
    job_detail = f"job {object_name(job)}: {failed.reason}: {failed.message or ''}".strip()
    if failed.reason == "DeadlineExceeded":
        return RunResult.failed(
            FailureReason.TIMEOUT,
            exit_code=terminated.exit_code if terminated else None,
            agent_seconds=seconds,
            detail=clip_detail(job_detail),
        )
    if terminated is None:
        waiting = classify_pod_waiting(pod) if pod is not None else None
        if waiting is not None:
            return waiting
        pod_reason = pod.status.reason if pod is not None and pod.status is not None else None
        return RunResult.failed(
            FailureReason.CRASH, detail=clip_detail(f"{job_detail}; pod reason {pod_reason or 'unknown'}")
        )
    tail = terminated.message or log_tail or ""
    if terminated.exit_code == 0:
        # The container exited 0 but the Job failed (evicted after exit, policy): not the agent's doing.
        return RunResult.failed(FailureReason.CRASH, exit_code=0, agent_seconds=seconds, detail=clip_detail(job_detail))
    reason = reason_from_agent_exit(terminated.exit_code, tail)
    detail = tail.strip() or f"{job_detail}; container {terminated.reason} exit {terminated.exit_code}"
    return RunResult.failed(reason, exit_code=terminated.exit_code, agent_seconds=seconds, detail=clip_detail(detail))
