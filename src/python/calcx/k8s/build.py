"""`python -m calcx.k8s.build --out DIR`: render and validate every manifest into a directory.

Pure Python and offline (schemas ship with kubernetes-validate). The directory is ready for
`kubectl apply -k DIR`; `examples/` holds one rendered agent Job and its attempt Secret for
reading (the controller renders the real ones per rollout); `ray/raycluster.yaml` is the KubeRay
cluster of a trainer on several GPU nodes, applied on its own (`kubectl apply -f`) where KubeRay
is installed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from calcx.contract.env import (
    AGL_EVENT_URL,
    AGL_OPENAI_BASE_URL,
    CALCX_ATTEMPT_ID,
    CALCX_ROLLOUT_ID,
    QUESTION,
    RESULT,
)
from calcx.k8s.ray import RAY_CLUSTER_FILE, RaySettings, render_ray_cluster
from calcx.k8s.render import JobSettings, RenderError, StaticSettings, render_attempt, render_static
from calcx.k8s.validate import DEFAULT_K8S_VERSION, ManifestInvalid, validate_all

#: Files that hold a secret (the server key's Secret): written owner-only (0600).
SECRET_FILES = frozenset({"server-key-secret.yaml"})
SECRET_FILE_MODE = 0o600

EXAMPLE_ROW = {"question": 'What is 2 + 3? Answer as "### ANSWER: x ###".', "result": "5"}


def build(
    out: Path, static: StaticSettings, server_key: str | None, version: str, ray: RaySettings | None = None
) -> list[Path]:
    """Render, validate, then write; nothing is written when anything is invalid."""
    rendered = render_static(static, server_key=server_key)
    rendered[RAY_CLUSTER_FILE] = render_ray_cluster(ray or RaySettings(), static)
    example = render_attempt(
        rollout_id="example-rollout",
        attempt_id="1",
        group_id="example-group",
        env={
            QUESTION: EXAMPLE_ROW["question"],
            RESULT: EXAMPLE_ROW["result"],
            AGL_OPENAI_BASE_URL: f"{static.server_url}/v1/rollouts/example-rollout/attempts/1/v1",
            AGL_EVENT_URL: f"{static.server_url}/v1/rollouts/example-rollout/attempts/1/events",
            CALCX_ROLLOUT_ID: "example-rollout",
            CALCX_ATTEMPT_ID: "1",
        },
        token="calcx-at.example-rollout.1.<nonce>.<hmac-sha256 of the server key>",
        deadline_s=300,
        settings=JobSettings(
            namespace=static.namespace, image=static.agent_image, ttl_seconds_after_finished=static.job_ttl_s
        ),
    )
    files = {name: text for name, (text, _) in rendered.items()}
    files["examples/agent-job.yaml"] = example.job_yaml
    files["examples/attempt-secret.yaml"] = example.secret_yaml
    objects = {name: obj for name, (_, obj) in rendered.items()}
    objects["examples/agent-job.yaml"] = example.job
    objects["examples/attempt-secret.yaml"] = example.secret
    validate_all(objects, version=version)
    written = []
    for name, text in sorted(files.items()):
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if name in SECRET_FILES:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, SECRET_FILE_MODE)
            os.fchmod(fd, SECRET_FILE_MODE)  # one an earlier build left keeps no wider mode
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
        else:
            path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calcx.k8s.build", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="directory to write the manifests into")
    d = StaticSettings()
    parser.add_argument("--namespace", default=d.namespace)
    parser.add_argument("--agent-image", default=d.agent_image)
    parser.add_argument("--controller-image", default=d.controller_image)
    parser.add_argument("--server-url", default=d.server_url, help="the server's URL as seen from the cluster")
    parser.add_argument("--server-key-file", type=Path, help="include a server-key Secret with this file's content")
    parser.add_argument("--image-pull-policy", default=d.image_pull_policy, choices=["Always", "IfNotPresent", "Never"])
    parser.add_argument("--max-jobs-per-s", type=float, default=d.max_jobs_per_s)
    parser.add_argument("--job-ttl-s", type=int, default=d.job_ttl_s)
    parser.add_argument("--k8s-version", default=DEFAULT_K8S_VERSION, help="Kubernetes version to validate against")
    r = RaySettings()
    parser.add_argument("--ray-image", default=r.image, help="image of every Ray node (its Ray must be the trainer's)")
    parser.add_argument("--ray-workers", type=int, default=r.workers, help="GPU worker nodes of the RayCluster")
    parser.add_argument("--ray-gpus-per-worker", type=int, default=r.gpus_per_worker, help="GPUs of each worker node")
    parser.add_argument("--ray-worker-cpu", default=r.worker_cpu, help="CPU of each worker node (request = limit)")
    parser.add_argument(
        "--ray-worker-memory", default=r.worker_memory, help="memory of each worker node (request = limit)"
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    server_key = None
    if args.server_key_file is not None:
        try:
            server_key = args.server_key_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            print(f"calcx.k8s.build: cannot read --server-key-file: {exc}", file=sys.stderr)
            return 2
    static = StaticSettings(
        namespace=args.namespace,
        agent_image=args.agent_image,
        controller_image=args.controller_image,
        server_url=args.server_url,
        image_pull_policy=args.image_pull_policy,
        max_jobs_per_s=args.max_jobs_per_s,
        job_ttl_s=args.job_ttl_s,
    )
    try:
        ray = RaySettings(
            image=args.ray_image,
            workers=args.ray_workers,
            gpus_per_worker=args.ray_gpus_per_worker,
            worker_cpu=args.ray_worker_cpu,
            worker_memory=args.ray_worker_memory,
        )
        written = build(args.out, static, server_key, args.k8s_version, ray)
    except (RenderError, ManifestInvalid) as exc:
        print(f"calcx.k8s.build: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    print(
        f"calcx.k8s.build: {len(written)} manifests rendered and validated against Kubernetes "
        f"{args.k8s_version} in {time.monotonic() - started:.1f} s",
        file=sys.stderr,
    )
    if server_key is None:
        print(
            f"calcx.k8s.build: create {args.out / 'server-key.env'} (key=<secret>) before `kubectl apply -k`",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
