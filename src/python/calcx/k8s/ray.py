"""The RayCluster of a trainer on several GPU nodes (KubeRay's `ray.io/v1`), rendered from
`raycluster.yaml.j2` and checked against its inputs like every calcx manifest.

Not part of the kustomization: `kubectl apply -k` must work on a cluster without KubeRay's CRDs.
The build writes it apart (`RAY_CLUSTER_FILE`), validated like the rest (calcx.k8s.validate).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from calcx.contract.env import CALCX_KEY
from calcx.k8s.render import RenderError, StaticSettings, expect, parse_one, render_text

#: Ray of the trainer's resolves (3rdparty/python/gpu-requirements.txt; a test compares): the
#: cluster's `rayVersion` and its image's, so the driver and the nodes speak the same protocol.
RAY_VERSION = "2.60.0"
#: The `ray` user of the rayproject/ray images (the namespace admits no pod that runs as root).
RAY_UID = 1000
RAY_CLUSTER_FILE = "ray/raycluster.yaml"
#: The environment variable that carries the server's URL to every Ray node (the controller's too).
CALCX_SERVER = "CALCX_SERVER"
WORKER_GROUP = "gpu"
GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class RaySettings:
    """The cluster's shape: a head without GPUs, `workers` nodes of `gpus_per_worker` GPUs each."""

    name: str = "calcx-trainer"
    image: str = f"rayproject/ray:{RAY_VERSION}-py312-gpu"
    workers: int = 1
    gpus_per_worker: int = 1
    worker_cpu: str = "8"
    worker_memory: str = "64Gi"
    worker_shm: str = "16Gi"  # /dev/shm (Ray's object store, NCCL): memory-backed
    head_cpu: str = "2"
    head_memory: str = "8Gi"
    head_shm: str = "2Gi"
    run_as_user: int = RAY_UID


def node_env(static: StaticSettings) -> list[dict[str, Any]]:
    """Every Ray container's environment: the server's URL, and its key from the Secret."""
    return [
        {"name": CALCX_SERVER, "value": static.server_url},
        {"name": CALCX_KEY, "valueFrom": {"secretKeyRef": {"name": static.server_key_secret, "key": "key"}}},
    ]


def render_ray_cluster(
    ray: RaySettings, static: StaticSettings, directory: Path | None = None
) -> tuple[str, dict[str, Any]]:
    """(YAML text, parsed) of the RayCluster, in the namespace and against the server of `static`."""
    for field in ("workers", "gpus_per_worker"):
        value = getattr(ray, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise RenderError(f"RayCluster {field} must be a positive integer, got {value!r}")
    source = "raycluster.yaml.j2"
    text = render_text(
        source,
        directory,
        **asdict(ray),
        namespace=static.namespace,
        server_url=static.server_url,
        server_key_secret=static.server_key_secret,
        image_pull_policy=static.image_pull_policy,
        ray_version=RAY_VERSION,
    )
    obj = parse_one(text, kind="RayCluster", source=source)
    _check(obj, ray, static, source)
    return text, obj


def _check(obj: dict[str, Any], ray: RaySettings, static: StaticSettings, source: str) -> None:
    try:
        spec = obj["spec"]
        groups = spec["workerGroupSpecs"]
        head = spec["headGroupSpec"]["template"]["spec"]
        worker = groups[0]["template"]["spec"]
    except (KeyError, IndexError, TypeError) as exc:
        raise RenderError(f"{source}: rendered RayCluster lacks {exc}") from exc
    expect(source, "metadata.name", obj["metadata"].get("name"), ray.name)
    expect(source, "metadata.namespace", obj["metadata"].get("namespace"), static.namespace)
    expect(source, "spec.rayVersion", spec.get("rayVersion"), RAY_VERSION)
    expect(source, "worker groups", [g.get("groupName") for g in groups], [WORKER_GROUP])
    for key in ("replicas", "minReplicas", "maxReplicas"):
        expect(source, f"worker group {key}", groups[0].get(key), ray.workers)
    env = node_env(static)
    for node, pod, gpus in (("head", head, 0), ("worker", worker, ray.gpus_per_worker)):
        containers = pod.get("containers") or [{}]
        expect(source, f"{node} containers", len(containers), 1)
        container = containers[0]
        expect(source, f"{node} image", container.get("image"), ray.image)
        expect(source, f"{node} env", container.get("env"), env)
        expect(source, f"{node} GPUs", container.get("resources", {}).get("limits", {}).get(GPU_RESOURCE, 0), gpus)
        expect(source, f"{node} automountServiceAccountToken", pod.get("automountServiceAccountToken"), False)
