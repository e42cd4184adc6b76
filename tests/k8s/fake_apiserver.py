"""A fake Kubernetes API server: a real HTTP server (FastAPI + uvicorn on 127.0.0.1) that answers
the handful of endpoints the k8s runner uses, so the runner can be tested through the real
`kubernetes` client and a real kubeconfig.

What it models:
- Jobs (batch/v1) and Secrets (v1): create (409 on a taken name), get, delete, list with
  equality label selectors; patch (merge of `metadata.ownerReferences`/labels, and a Job's
  `spec.suspend`).
- Pods (v1): list/get, and `pods/{name}/log` (the scripted log text).
- Watches: `?watch=true&resourceVersion=N&timeoutSeconds=T` as a chunked stream of JSON lines,
  replaying events after N, then live events, ending after T seconds.
- A scripted "kubelet + Job controller": creating a Job (or resuming a suspended one, `spec.suspend`
  patched to false) creates one Pod whose life follows the
  `Scenario` registered for the Job's image (pending -> waiting reason / running -> exit code),
  and the Job's conditions follow the Pod (Complete on exit 0, Failed/BackoffLimitExceeded
  otherwise, Failed/DeadlineExceeded once `activeDeadlineSeconds` pass). Before "starting" the
  container it resolves `secretKeyRef`s like the kubelet: a missing Secret or key gives
  `CreateContainerConfigError`.
- Deleting a Job deletes its Pods and, like the garbage collector, Secrets whose
  ownerReferences name the Job's uid.
- Bearer-token auth: any other token is answered 401.

What it does NOT model: scheduling, nodes, real containers or images, retries (backoffLimit is
taken as 0), restartPolicy, ttlSecondsAfterFinished, admission/validation of object schemas
(use `calcx.k8s.validate` for that), RBAC, field selectors, set-based selectors, strategic
merge semantics beyond the fields above, resourceVersion compaction (no 410 unless a test
calls `expire_history`), bookmarks, pagination, or any other resource or API group.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from calcx.common.serving import ThreadedServer


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Step:
    """One scripted change of the Pod, `after_s` seconds after the previous step."""

    after_s: float
    action: str  # "pending" | "running" | "waiting" | "exit" | "hang"
    reason: str = ""
    message: str = ""
    exit_code: int = 0


@dataclass
class Scenario:
    steps: list[Step]
    log: str = ""


SCENARIOS: dict[str, Scenario] = {
    "fake/agent:ok": Scenario([Step(0.05, "running"), Step(0.2, "exit", exit_code=0)], log="done\n"),
    "fake/agent:exit-11": Scenario(
        [
            Step(0.05, "running"),
            Step(0.1, "exit", exit_code=11, message="calcx-agent: failure: calculator_failed MCP calculator died\n"),
        ]
    ),
    "fake/agent:exit-13-log-only": Scenario(
        [Step(0.05, "running"), Step(0.1, "exit", exit_code=13)],
        log="posting reward\ncalcx-agent: failure: reward_post_failed 503 from events URL\n",
    ),
    "fake/agent:oom": Scenario([Step(0.05, "running"), Step(0.1, "exit", exit_code=137, reason="OOMKilled")]),
    "fake/agent:image-pull": Scenario(
        [
            Step(0.05, "waiting", reason="ErrImagePull", message="pull access denied for fake/agent"),
            Step(0.3, "waiting", reason="ImagePullBackOff", message="Back-off pulling image"),
        ]
    ),
    "fake/agent:invalid-name": Scenario([Step(0.05, "waiting", reason="InvalidImageName", message="bad ref")]),
    "fake/agent:hang": Scenario([Step(0.05, "running"), Step(0.0, "hang")]),
    "fake/agent:slow-pull": Scenario(
        [Step(0.05, "waiting", reason="ContainerCreating", message=""), Step(0.0, "hang")]
    ),
}


def _matches(labels: dict[str, str], selector: str | None) -> bool:
    if not selector:
        return True
    for term in selector.split(","):
        key, _, value = term.partition("=")
        if labels.get(key.strip()) != value.strip():
            return False
    return True


class FakeApiServer:
    """State + FastAPI app + a uvicorn thread. Use as a context manager."""

    def __init__(self, token: str = "fake-token", scenarios: dict[str, Scenario] | None = None) -> None:
        self.token = token
        self.scenarios = dict(SCENARIOS if scenarios is None else scenarios)
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (kind, ns, name) -> object
        self.history: list[tuple[int, str, str, dict[str, Any]]] = []  # (rv, kind, type, object)
        self.history_floor = 0
        self.enforce_deadlines = True  # False: play a cluster that never reports DeadlineExceeded
        # (monotonic time, method, path, JSON body, query parameters) of every request
        self.requests: list[tuple[float, str, str, dict[str, Any] | None, dict[str, str]]] = []
        self._rv = itertools.count(1)
        self._changed: asyncio.Event | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: uvicorn.Server | None = None
        self._thread: ThreadedServer | None = None
        self.url = ""
        self.app = self._build_app()

    # -- life --

    def __enter__(self) -> FakeApiServer:
        self._thread = ThreadedServer(self.app, name="fake-apiserver").start(10)
        self._server = self._thread.server
        self._loop = self._thread.loop
        self._changed = asyncio.Event()
        self.url = self._thread.url
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop serving; the watches still streaming are woken so that they end, and the tasks
        still driving pods are cancelled when the loop closes."""
        if self._thread is not None:
            self._thread.server.should_exit = True
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._wake)
            self._thread.stop(15)

    def kubeconfig(self, path: str, namespace: str = "calcx") -> str:
        """Write a kubeconfig that points the real client at this server; returns its path."""
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": self.token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}],
        }
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
        return path

    # -- inspection from tests (thread-safe snapshots) --

    def call(self, fn: Any, *args: Any) -> Any:
        async def run() -> Any:
            return fn(*args)

        assert self._loop is not None, "the server is not running"
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def names(self, kind: str, namespace: str = "calcx") -> list[str]:
        return self.call(lambda: sorted(n for (k, ns, n) in self.objects if k == kind and ns == namespace))

    def get(self, kind: str, name: str, namespace: str = "calcx") -> dict[str, Any] | None:
        return self.call(lambda: copy.deepcopy(self.objects.get((kind, namespace, name))))

    def requests_of(
        self, method: str, path_part: str
    ) -> list[tuple[float, str, str, dict[str, Any] | None, dict[str, str]]]:
        return self.call(lambda: [r for r in self.requests if r[1] == method and path_part in r[2]])

    def expire_history(self) -> None:
        """Pretend etcd compacted: watches from any older resourceVersion get 410 Gone."""
        self.call(lambda: setattr(self, "history_floor", self.history[-1][0] if self.history else 0))

    # -- state changes (on the server loop) --

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    def _store(self, kind: str, event: str, obj: dict[str, Any]) -> dict[str, Any]:
        rv = next(self._rv)
        obj["metadata"]["resourceVersion"] = str(rv)
        key = (kind, obj["metadata"]["namespace"], obj["metadata"]["name"])
        if event == "DELETED":
            self.objects.pop(key, None)
        else:
            self.objects[key] = obj
        self.history.append((rv, kind, event, copy.deepcopy(obj)))
        self._wake()
        return obj

    def _new_meta(self, body: dict[str, Any], namespace: str) -> dict[str, Any]:
        meta = body.setdefault("metadata", {})
        meta["namespace"] = namespace
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        return body

    def _delete_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        job = self.objects.get(("job", namespace, name))
        if job is None:
            return None
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
        for (kind, ns, _pod_name), pod in list(self.objects.items()):
            if kind == "pod" and ns == namespace and pod["metadata"]["labels"].get("job-name") == name:
                self._store("pod", "DELETED", pod)
        uid = job["metadata"]["uid"]
        for (kind, ns, _), secret in list(self.objects.items()):
            if (
                kind == "secret"
                and ns == namespace
                and any(ref.get("uid") == uid for ref in secret["metadata"].get("ownerReferences") or [])
            ):
                self._store("secret", "DELETED", secret)
        return self._store("job", "DELETED", job)

    async def _drive(self, namespace: str, job_name: str) -> None:
        """The kubelet and Job controller for one Job, following its image's Scenario."""
        job = self.objects[("job", namespace, job_name)]
        pod_spec = copy.deepcopy(job["spec"]["template"]["spec"])
        container = pod_spec["containers"][0]
        scenario = self.scenarios.get(container["image"]) or Scenario(
            [Step(0.05, "waiting", reason="ErrImagePull", message=f"image {container['image']} not found")]
        )
        labels = dict(job["spec"]["template"]["metadata"].get("labels") or {})
        labels.update(
            {"job-name": job_name, "batch.kubernetes.io/job-name": job_name, "controller-uid": job["metadata"]["uid"]}
        )
        pod = self._new_meta(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{job_name}-{uuid.uuid4().hex[:5]}",
                    "labels": labels,
                    "ownerReferences": [
                        {
                            "apiVersion": "batch/v1",
                            "kind": "Job",
                            "name": job_name,
                            "uid": job["metadata"]["uid"],
                            "controller": True,
                        }
                    ],
                },
                "spec": pod_spec,
                "status": {"phase": "Pending"},
            },
            namespace,
        )
        pod["_log"] = scenario.log
        self._store("pod", "ADDED", pod)
        job["status"] = {"active": 1, "startTime": _now()}
        self._store("job", "MODIFIED", job)
        deadline = job["spec"].get("activeDeadlineSeconds")
        started_at = None

        def container_status(state: dict[str, Any]) -> list[dict[str, Any]]:
            return [
                {
                    "name": container["name"],
                    "image": container["image"],
                    "imageID": "",
                    "ready": "running" in state,
                    "restartCount": 0,
                    "state": state,
                }
            ]

        async def run_steps() -> None:
            nonlocal started_at
            for step in scenario.steps:
                await asyncio.sleep(step.after_s)
                if step.action == "hang":
                    await asyncio.Event().wait()
                if step.action in ("running", "exit"):
                    missing = self._missing_secret(namespace, container)
                    if missing:
                        pod["status"] = {
                            "phase": "Pending",
                            "containerStatuses": container_status(
                                {"waiting": {"reason": "CreateContainerConfigError", "message": missing}}
                            ),
                        }
                        self._store("pod", "MODIFIED", pod)
                        await asyncio.Event().wait()
                if step.action == "pending":
                    pod["status"] = {"phase": "Pending"}
                elif step.action == "waiting":
                    pod["status"] = {
                        "phase": "Pending",
                        "containerStatuses": container_status(
                            {"waiting": {"reason": step.reason, "message": step.message}}
                        ),
                    }
                elif step.action == "running":
                    started_at = _now()
                    pod["status"] = {
                        "phase": "Running",
                        "containerStatuses": container_status({"running": {"startedAt": started_at}}),
                    }
                elif step.action == "exit":
                    ok = step.exit_code == 0
                    pod["status"] = {
                        "phase": "Succeeded" if ok else "Failed",
                        "containerStatuses": container_status(
                            {
                                "terminated": {
                                    "exitCode": step.exit_code,
                                    "reason": step.reason or ("Completed" if ok else "Error"),
                                    "message": step.message or None,
                                    "startedAt": started_at or _now(),
                                    "finishedAt": _now(),
                                }
                            }
                        ),
                    }
                    self._store("pod", "MODIFIED", pod)
                    await asyncio.sleep(0.02)  # the Job controller notices a moment later
                    self._finish_job(
                        job,
                        "Complete" if ok else "Failed",
                        None if ok else "BackoffLimitExceeded",
                        None if ok else "Job has reached the specified backoff limit",
                    )
                    return
                self._store("pod", "MODIFIED", pod)

        try:
            if deadline is None or not self.enforce_deadlines:
                await run_steps()
            else:
                await asyncio.wait_for(run_steps(), deadline)
        except asyncio.TimeoutError:
            self._store("pod", "DELETED", pod)
            self._finish_job(job, "Failed", "DeadlineExceeded", "Job was active longer than specified deadline")

    def _finish_job(self, job: dict[str, Any], kind: str, reason: str | None, message: str | None) -> None:
        cond: dict[str, str | None] = {
            "type": kind,
            "status": "True",
            "lastProbeTime": _now(),
            "lastTransitionTime": _now(),
        }
        if reason:
            cond.update(reason=reason, message=message)
        job["status"] = {
            "conditions": [cond],
            "startTime": job.get("status", {}).get("startTime", _now()),
            "succeeded" if kind == "Complete" else "failed": 1,
        }
        if kind == "Complete":
            job["status"]["completionTime"] = _now()
        self._store("job", "MODIFIED", job)

    def _missing_secret(self, namespace: str, container: dict[str, Any]) -> str | None:
        for env in container.get("env") or []:
            ref = (env.get("valueFrom") or {}).get("secretKeyRef")
            if not ref:
                continue
            secret = self.objects.get(("secret", namespace, ref["name"]))
            if secret is None:
                return f'secret "{ref["name"]}" not found'
            data = {**(secret.get("data") or {}), **(secret.get("stringData") or {})}
            if ref["key"] not in data:
                return f'couldn\'t find key {ref["key"]} in Secret {namespace}/{ref["name"]}'
        return None

    # -- HTTP --

    def _build_app(self) -> FastAPI:
        app = FastAPI()
        kinds = {
            "jobs": ("job", "batch/v1", "Job"),
            "secrets": ("secret", "v1", "Secret"),
            "pods": ("pod", "v1", "Pod"),
        }

        def status(code: int, reason: str, message: str) -> JSONResponse:
            return JSONResponse(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "message": message,
                    "reason": reason,
                    "code": code,
                },
                status_code=code,
            )

        @app.middleware("http")
        async def auth(request: Request, call_next: Any) -> Any:
            body = None
            if request.method in ("POST", "PATCH", "PUT", "DELETE"):
                raw = await request.body()
                body = json.loads(raw) if raw else None
            self.requests.append((time.monotonic(), request.method, request.url.path, body, dict(request.query_params)))
            if request.headers.get("authorization") != f"Bearer {self.token}":
                return status(401, "Unauthorized", "Unauthorized")
            return await call_next(request)

        def public(obj: dict[str, Any]) -> dict[str, Any]:
            return {k: v for k, v in obj.items() if not k.startswith("_")}

        async def collection(request: Request, ns: str, resource: str) -> Any:
            kind, api_version, kind_name = kinds[resource]
            q = request.query_params
            selector = q.get("labelSelector")
            if q.get("watch") in ("true", "1"):
                since = int(q.get("resourceVersion") or 0)
                if since and since < self.history_floor:

                    async def gone() -> Any:
                        yield json.dumps(
                            {
                                "type": "ERROR",
                                "object": {
                                    "kind": "Status",
                                    "apiVersion": "v1",
                                    "status": "Failure",
                                    "message": "too old resource version",
                                    "reason": "Expired",
                                    "code": 410,
                                },
                            }
                        ) + "\n"

                    return StreamingResponse(gone(), media_type="application/json")
                timeout = float(q.get("timeoutSeconds") or 1800)
                return StreamingResponse(self._watch(kind, ns, selector, since, timeout), media_type="application/json")
            items = [
                public(o)
                for (k, n, _), o in sorted(self.objects.items())
                if k == kind and n == ns and _matches(o["metadata"].get("labels") or {}, selector)
            ]
            rv = str(self.history[-1][0]) if self.history else "0"
            return {
                "apiVersion": api_version,
                "kind": f"{kind_name}List",
                "metadata": {"resourceVersion": rv},
                "items": items,
            }

        async def create(request: Request, ns: str, resource: str) -> Any:
            kind, _, _ = kinds[resource]
            body = await request.json()
            name = body.get("metadata", {}).get("name")
            if not name:
                return status(422, "Invalid", f"{resource}: metadata.name: Required value")
            if (kind, ns, name) in self.objects:
                return status(409, "AlreadyExists", f'{resource} "{name}" already exists')
            obj = self._store(kind, "ADDED", self._new_meta(body, ns))
            if kind == "job" and not (obj.get("spec") or {}).get("suspend"):
                self._tasks[name] = asyncio.get_running_loop().create_task(self._drive(ns, name))
            return JSONResponse(public(obj), status_code=201)

        async def item(request: Request, ns: str, resource: str, name: str) -> Any:
            kind, _, _ = kinds[resource]
            obj = self.objects.get((kind, ns, name))
            if obj is None:
                return status(404, "NotFound", f'{resource} "{name}" not found')
            if request.method == "GET":
                return public(obj)
            if request.method == "PATCH":
                patch = await request.json()
                meta = patch.get("metadata") or {}
                if "ownerReferences" in meta:
                    obj["metadata"]["ownerReferences"] = meta["ownerReferences"]
                if "labels" in meta:
                    obj["metadata"].setdefault("labels", {}).update(meta["labels"])
                resume = kind == "job" and (patch.get("spec") or {}).get("suspend") is False
                if kind == "job" and "suspend" in (patch.get("spec") or {}):
                    obj["spec"]["suspend"] = patch["spec"]["suspend"]
                stored = public(self._store(kind, "MODIFIED", obj))
                if resume and name not in self._tasks:
                    self._tasks[name] = asyncio.get_running_loop().create_task(self._drive(ns, name))
                return stored
            # DELETE
            if kind == "job":
                deleted = self._delete_job(ns, name)
                assert deleted is not None  # the Job exists: looked up above
            else:
                deleted = self._store(kind, "DELETED", obj)
            return public(deleted)

        @app.api_route("/apis/batch/v1/namespaces/{ns}/{resource}", methods=["GET", "POST"])
        @app.api_route("/api/v1/namespaces/{ns}/{resource}", methods=["GET", "POST"])
        async def coll(request: Request, ns: str, resource: str) -> Any:
            expected_api = "batch" if request.url.path.startswith("/apis/batch") else "core"
            if resource not in kinds or (resource == "jobs") != (expected_api == "batch"):
                return status(404, "NotFound", f"the server could not find the requested resource ({resource})")
            if request.method == "POST":
                return await create(request, ns, resource)
            return await collection(request, ns, resource)

        @app.api_route("/apis/batch/v1/namespaces/{ns}/{resource}/{name}", methods=["GET", "DELETE", "PATCH"])
        @app.api_route("/api/v1/namespaces/{ns}/{resource}/{name}", methods=["GET", "DELETE", "PATCH"])
        async def one(request: Request, ns: str, resource: str, name: str) -> Any:
            if resource not in kinds:
                return status(404, "NotFound", f"the server could not find the requested resource ({resource})")
            return await item(request, ns, resource, name)

        @app.get("/api/v1/namespaces/{ns}/pods/{name}/log")
        async def pod_log(ns: str, name: str, tailLines: int | None = None) -> Any:  # noqa: N803 - k8s spelling
            pod = self.objects.get(("pod", ns, name))
            if pod is None:
                return status(404, "NotFound", f'pods "{name}" not found')
            lines = pod.get("_log", "").splitlines(keepends=True)
            return PlainTextResponse("".join(lines[-tailLines:] if tailLines else lines))

        return app

    async def _watch(self, kind: str, ns: str, selector: str | None, since: int, timeout: float) -> Any:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        index = 0
        while True:
            changed = self._changed
            assert changed is not None  # set when the server starts
            while index < len(self.history):
                rv, obj_kind, event, obj = self.history[index]
                index += 1
                if rv <= since or obj_kind != kind or obj["metadata"]["namespace"] != ns:
                    continue
                if not _matches(obj["metadata"].get("labels") or {}, selector):
                    continue
                public = {k: v for k, v in obj.items() if not k.startswith("_")}
                yield json.dumps({"type": event, "object": public}) + "\n"
            remaining = end - loop.time()
            if remaining <= 0 or (self._server is not None and self._server.should_exit):
                return
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except asyncio.TimeoutError:
                return
