"""Render calcx's Kubernetes manifests from the Jinja templates in `src/k8s/templates`.

Values are placed through the `q` filter (see `escaping.yaml_quote`), then every rendered
document is parsed back and checked: one document, the expected kind, and each value that
came from outside (names, labels, env, image) equal to its input. A template edit or an input
that changed the structure is an error here, not a surprise in the cluster.
"""

from __future__ import annotations

import ipaddress
import math
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import yaml

from calcx.api.tokens import key_problem
from calcx.contract.env import AGL_KEY, env_problem
from calcx.contract.images import AGENT_UID, CONTROLLER_UID
from calcx.k8s.escaping import UnsafeValueError, dns_label, label_value, yaml_int, yaml_quote

TEMPLATES_ENV = "CALCX_K8S_TEMPLATES"
SECRET_KEY_NAME = "agl-key"
MANAGED_BY = "calcx-controller"
LABEL_PREFIX = "calcx.dev/"
#: `app.kubernetes.io/name` of agent pods (the NetworkPolicy selects them by it) and of the
#: server's pods (the one peer agents may reach, unless the server URL names an IP address).
AGENT_APP_NAME = "calcx-agent"
SERVER_APP_NAME = "calcx-server"


class RenderError(ValueError):
    """A manifest could not be rendered, or its parsed form does not match its inputs."""


def templates_dir() -> Path:
    """Where the templates live: $CALCX_K8S_TEMPLATES, `src/k8s/templates` of this checkout, or
    the copy a PEX carries as resources (`src/k8s:templates`)."""
    candidates = []
    if os.environ.get(TEMPLATES_ENV):
        candidates.append(Path(os.environ[TEMPLATES_ENV]))
    here = Path(__file__).resolve()
    candidates.append(here.parents[3] / "k8s" / "templates")  # a checkout: src/python/calcx/k8s
    candidates.append(here.parents[2] / "src" / "k8s" / "templates")  # a PEX: templates as resources
    candidates.append(Path.cwd() / "src" / "k8s" / "templates")
    for candidate in candidates:
        if (candidate / "job.yaml.j2").is_file():
            return candidate
    raise RenderError(
        "cannot find the Kubernetes templates (job.yaml.j2); looked in "
        + ", ".join(str(c) for c in candidates)
        + f"; set {TEMPLATES_ENV} to the src/k8s/templates directory"
    )


def _environment(directory: Path | None = None) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(directory or templates_dir())),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    env.filters["q"] = yaml_quote
    env.filters["int_"] = yaml_int
    return env


def render_text(template: str, directory: Path | None = None, **context: Any) -> str:
    """Render one template to YAML text."""
    try:
        return _environment(directory).get_template(template).render(**context)
    except UnsafeValueError as exc:
        raise RenderError(f"{template}: {exc}") from exc
    except jinja2.TemplateError as exc:
        raise RenderError(f"{template}: template error: {exc}") from exc


def parse_one(text: str, *, kind: str, source: str) -> dict[str, Any]:
    """The single YAML document in `text`, which must be a mapping of `kind`."""
    try:
        docs = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        raise RenderError(f"{source}: rendered text is not valid YAML: {exc}") from exc
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise RenderError(f"{source}: expected exactly one YAML mapping, got {len(docs)} document(s)")
    if docs[0].get("kind") != kind:
        raise RenderError(f"{source}: expected kind {kind}, got {docs[0].get('kind')!r}")
    return docs[0]


def expect(source: str, what: str, got: Any, want: Any) -> None:
    if got != want:
        raise RenderError(f"{source}: {what} is {got!r} after rendering, expected {want!r}")


@dataclass(frozen=True)
class JobSettings:
    """Cluster-side settings of the agent Jobs (the same for every rollout)."""

    namespace: str = "calcx"
    image: str = "calcx/agent:latest"
    image_pull_policy: str = "IfNotPresent"
    ttl_seconds_after_finished: int = 600
    controller_id: str = MANAGED_BY
    service_account: str | None = None
    image_pull_secret: str | None = None
    cpu_request: str = "250m"
    memory_request: str = "256Mi"
    cpu_limit: str = "1"
    memory_limit: str = "1Gi"
    tmp_size_limit: str = "64Mi"
    run_as_user: int = AGENT_UID
    termination_grace_seconds: int = 5


@dataclass(frozen=True)
class RenderedAttempt:
    """The Job and the attempt-token Secret of one rollout attempt, as text and as parsed dicts."""

    job_name: str
    secret_name: str
    job: dict[str, Any]
    secret: dict[str, Any]
    job_yaml: str
    secret_yaml: str
    labels: dict[str, str] = field(default_factory=dict)


def attempt_labels(settings: JobSettings, rollout_id: str, attempt_id: str, group_id: str | None) -> dict[str, str]:
    labels = {
        "app.kubernetes.io/name": AGENT_APP_NAME,
        "app.kubernetes.io/part-of": "calcx",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        LABEL_PREFIX + "controller": label_value(settings.controller_id),
        LABEL_PREFIX + "rollout-id": label_value(rollout_id),
        LABEL_PREFIX + "attempt-id": label_value(attempt_id),
    }
    if group_id:
        labels[LABEL_PREFIX + "group-id"] = label_value(group_id)
    return labels


def job_name_for(rollout_id: str, attempt_id: str) -> str:
    """Deterministic Job name: a second controller (or a restart) cannot start the same attempt twice."""
    return dns_label("calcx", rollout_id, f"a{attempt_id}")


def render_attempt(
    *,
    rollout_id: str,
    attempt_id: str,
    group_id: str | None,
    env: Mapping[str, str],
    token: str,
    deadline_s: float,
    settings: JobSettings,
    directory: Path | None = None,
) -> RenderedAttempt:
    """Render and check the Job + attempt Secret for one claimed attempt.

    `env` is the agent environment from the claim; `AGL_KEY` in it is ignored because the Job
    reads the key from the Secret. The deadline becomes `activeDeadlineSeconds` (rounded up).
    """
    if not (deadline_s > 0 and math.isfinite(deadline_s)):
        raise RenderError(f"deadline_s must be a positive finite number, got {deadline_s!r}")
    env_items = [(k, v) for k, v in env.items() if k != AGL_KEY]
    for k, v in env_items:
        problem = env_problem(k, v)
        if problem is not None:  # refused here rather than by a container that cannot start
            raise RenderError(f"rollout {rollout_id!r} attempt {attempt_id!r}: {problem}")
    job_name = job_name_for(rollout_id, attempt_id)
    secret_name = f"{job_name}-key"
    labels = attempt_labels(settings, rollout_id, attempt_id, group_id)
    annotations = {LABEL_PREFIX + "rollout-id": rollout_id, LABEL_PREFIX + "attempt-id": attempt_id}
    if group_id is not None:
        annotations[LABEL_PREFIX + "group-id"] = group_id
    common = {"namespace": settings.namespace, "labels": labels, "secret_key": SECRET_KEY_NAME}
    try:
        job_yaml = render_text(
            "job.yaml.j2",
            directory,
            **{**asdict(settings), **common},  # the template names each setting as JobSettings does
            name=job_name,
            annotations=annotations,
            env=env_items,
            secret_name=secret_name,
            active_deadline_seconds=max(1, math.ceil(deadline_s)),
        )
        secret_yaml = render_text("attempt-secret.yaml.j2", directory, name=secret_name, token=token, **common)
    except UnsafeValueError as exc:
        raise RenderError(f"rollout {rollout_id!r} attempt {attempt_id!r}: {exc}") from exc
    job = parse_one(job_yaml, kind="Job", source="job.yaml.j2")
    secret = parse_one(secret_yaml, kind="Secret", source="attempt-secret.yaml.j2")
    _check_job(job, job_name, settings, labels, annotations, env_items, secret_name)
    expect("attempt-secret.yaml.j2", "metadata.name", secret.get("metadata", {}).get("name"), secret_name)
    expect("attempt-secret.yaml.j2", "stringData", secret.get("stringData"), {SECRET_KEY_NAME: token})
    return RenderedAttempt(job_name, secret_name, job, secret, job_yaml, secret_yaml, labels)


def _check_job(
    job: dict[str, Any],
    name: str,
    settings: JobSettings,
    labels: dict[str, str],
    annotations: dict[str, str],
    env_items: list[tuple[str, str]],
    secret_name: str,
) -> None:
    src = "job.yaml.j2"
    try:
        meta = job["metadata"]
        spec = job["spec"]
        pod = spec["template"]
        container = pod["spec"]["containers"][0]
    except (KeyError, IndexError, TypeError) as exc:
        raise RenderError(f"{src}: rendered Job lacks {exc}") from exc
    expect(src, "top-level keys", sorted(job), ["apiVersion", "kind", "metadata", "spec"])
    expect(src, "metadata.name", meta.get("name"), name)
    expect(src, "metadata.namespace", meta.get("namespace"), settings.namespace)
    expect(src, "metadata.labels", meta.get("labels"), labels)
    expect(src, "metadata.annotations", meta.get("annotations"), annotations)
    expect(src, "spec.template.metadata.labels", pod.get("metadata", {}).get("labels"), labels)
    expect(src, "spec.backoffLimit", spec.get("backoffLimit"), 0)
    expect(src, "restartPolicy", pod["spec"].get("restartPolicy"), "Never")
    expect(src, "number of containers", len(pod["spec"]["containers"]), 1)
    expect(src, "container image", container.get("image"), settings.image)
    want_env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in env_items]
    want_env.append({"name": AGL_KEY, "valueFrom": {"secretKeyRef": {"name": secret_name, "key": SECRET_KEY_NAME}}})
    expect(src, "container env", container.get("env"), want_env)


_JOB_DEFAULTS = JobSettings()


@dataclass(frozen=True)
class StaticSettings:
    """Settings of the manifests applied once per namespace (`python -m calcx.k8s.build`)."""

    # where the controller runs is where its agent Jobs run: those defaults are JobSettings'
    namespace: str = _JOB_DEFAULTS.namespace
    service_account: str = "calcx-controller"
    server_key_secret: str = "calcx-server-key"
    controller_image: str = "calcx/controller:latest"
    controller_run_as_user: int = CONTROLLER_UID
    agent_image: str = _JOB_DEFAULTS.image
    image_pull_policy: str = _JOB_DEFAULTS.image_pull_policy
    server_url: str = "http://calcx-server:8000"
    replicas: int = 1
    concurrency: int = 32
    max_jobs_per_s: float = 5.0
    job_ttl_s: int = _JOB_DEFAULTS.ttl_seconds_after_finished


#: file name -> (template, kind); applied in this order.
STATIC_MANIFESTS: dict[str, tuple[str, str]] = {
    "namespace.yaml": ("namespace.yaml.j2", "Namespace"),
    "serviceaccount.yaml": ("serviceaccount.yaml.j2", "ServiceAccount"),
    "role.yaml": ("role.yaml.j2", "Role"),
    "rolebinding.yaml": ("rolebinding.yaml.j2", "RoleBinding"),
    "controller-deployment.yaml": ("controller-deployment.yaml.j2", "Deployment"),
    "networkpolicy.yaml": ("networkpolicy.yaml.j2", "NetworkPolicy"),
}


def server_peer(server_url: str) -> tuple[str | None, int]:
    """(CIDR of the server when the URL names an IP address, else None; the server's port)."""
    parsed = urllib.parse.urlsplit(server_url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise RenderError(f"server URL {server_url!r} must be http(s)://HOST[:PORT]")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        address = ipaddress.ip_address(parsed.hostname)
    except ValueError:
        return None, port
    return f"{address}/{address.max_prefixlen}", port


def render_static(
    settings: StaticSettings, *, server_key: str | None = None, directory: Path | None = None
) -> dict[str, tuple[str, dict[str, Any]]]:
    """file name -> (YAML text, parsed) for the namespace-level manifests and the kustomization.

    With `server_key`, the server-key Secret is rendered too; without it the kustomization
    generates that Secret from a `server-key.env` file the operator writes.
    """
    context = {
        "namespace": settings.namespace,
        "service_account": settings.service_account,
        "server_key_secret": settings.server_key_secret,
        "controller_image": settings.controller_image,
        "controller_run_as_user": settings.controller_run_as_user,
        "agent_image": settings.agent_image,
        "image_pull_policy": settings.image_pull_policy,
        "server_url": settings.server_url,
        "replicas": settings.replicas,
        "concurrency": settings.concurrency,
        "max_jobs_per_s": repr(float(settings.max_jobs_per_s)),
        "job_ttl_s": str(settings.job_ttl_s),
        "agent_app_name": AGENT_APP_NAME,
        "server_app_name": SERVER_APP_NAME,
    }
    context["server_cidr"], context["server_port"] = server_peer(settings.server_url)
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for filename, (template, kind) in STATIC_MANIFESTS.items():
        text = render_text(template, directory, **context)
        obj = parse_one(text, kind=kind, source=template)
        where = (
            ("metadata.name", obj["metadata"].get("name"))
            if kind == "Namespace"
            else ("metadata.namespace", obj["metadata"].get("namespace"))
        )
        expect(template, where[0], where[1], settings.namespace)
        out[filename] = (text, obj)
    if server_key is not None:
        problem = key_problem(server_key)
        if problem is not None:
            raise RenderError(problem)
        text = render_text(
            "server-key-secret.yaml.j2",
            directory,
            name=settings.server_key_secret,
            namespace=settings.namespace,
            key=server_key,
        )
        obj = parse_one(text, kind="Secret", source="server-key-secret.yaml.j2")
        expect("server-key-secret.yaml.j2", "stringData", obj.get("stringData"), {"key": server_key})
        out["server-key-secret.yaml"] = (text, obj)
    resources = list(out)
    text = render_text(
        "kustomization.yaml.j2",
        directory,
        namespace=settings.namespace,
        resources=resources,
        server_key_included=server_key is not None,
        server_key_secret=settings.server_key_secret,
    )
    obj = parse_one(text, kind="Kustomization", source="kustomization.yaml.j2")
    expect("kustomization.yaml.j2", "resources", obj.get("resources"), resources)
    out["kustomization.yaml"] = (text, obj)
    return out
