"""A JSON schema (draft 2020-12) of KubeRay's `RayCluster` (`ray.io/v1`), for the fields calcx
renders, written here: kubernetes-validate has schemas for Kubernetes' own kinds only, and
KubeRay's CRD (its openAPIV3Schema) ships in no PyPI package.

Structural, and closed where calcx writes: an unknown or misspelt field of the cluster, its head
group or a worker group fails, as do a worker group without `replicas`/`minReplicas`/`maxReplicas`,
a container without resource limits, a pod that mounts a service-account token, and the server
key as a plain env value. The pod templates themselves are checked by kubernetes-validate's strict
PodTemplate schema (calcx.k8s.validate), not here.
"""

from __future__ import annotations

from typing import Any

from calcx.contract.env import AGL_KEY, CALCX_KEY

API_VERSION = "ray.io/v1"
KIND = "RayCluster"
#: Variables that hold a key: only ever from a Secret (`valueFrom.secretKeyRef`), never a value.
SECRET_ENV = (CALCX_KEY, AGL_KEY)

_DNS_NAME = {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"}
_COUNT = {"type": "integer", "minimum": 0}
# ray start's flags: KubeRay passes each as --KEY=VALUE and takes only strings
_START_PARAMS = {"type": "object", "additionalProperties": {"type": "string"}}

_SECRET_ENV_RULES = [
    {
        "if": {"properties": {"name": {"const": name}}, "required": ["name"]},
        "then": {
            "required": ["valueFrom"],
            "not": {"required": ["value"]},
            "properties": {"valueFrom": {"required": ["secretKeyRef"]}},
        },
    }
    for name in SECRET_ENV
]

_CONTAINER = {
    "type": "object",
    "required": ["name", "image", "resources"],
    "properties": {
        "env": {"type": "array", "items": {"type": "object", "allOf": _SECRET_ENV_RULES}},
        "resources": {
            "type": "object",
            "required": ["limits"],
            "properties": {"limits": {"type": "object", "required": ["cpu", "memory"]}},
        },
    },
}

_POD_TEMPLATE = {
    "type": "object",
    "required": ["spec"],
    "properties": {
        "spec": {
            "type": "object",
            "required": ["containers", "automountServiceAccountToken"],
            "properties": {
                # no autoscaler: no Ray node talks to the Kubernetes API
                "automountServiceAccountToken": {"const": False},
                "containers": {"type": "array", "minItems": 1, "items": _CONTAINER},
            },
        },
    },
}

RAY_CLUSTER_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": API_VERSION},
        "kind": {"const": KIND},
        "metadata": {
            "type": "object",
            "required": ["name", "namespace"],
            "properties": {
                "name": _DNS_NAME,
                "namespace": _DNS_NAME,
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "required": ["rayVersion", "headGroupSpec", "workerGroupSpecs"],
            "additionalProperties": False,
            "properties": {
                "rayVersion": {"type": "string", "pattern": r"^[0-9]+\.[0-9]+\.[0-9]+$"},
                "enableInTreeAutoscaling": {"type": "boolean"},
                "headGroupSpec": {
                    "type": "object",
                    "required": ["rayStartParams", "template"],
                    "additionalProperties": False,
                    "properties": {
                        "rayStartParams": _START_PARAMS,
                        "serviceType": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
                        "template": _POD_TEMPLATE,
                    },
                },
                "workerGroupSpecs": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": [
                            "groupName",
                            "replicas",
                            "minReplicas",
                            "maxReplicas",
                            "rayStartParams",
                            "template",
                        ],
                        "additionalProperties": False,
                        "properties": {
                            "groupName": _DNS_NAME,
                            "replicas": _COUNT,
                            "minReplicas": _COUNT,
                            "maxReplicas": {"type": "integer", "minimum": 1},
                            "rayStartParams": _START_PARAMS,
                            "template": _POD_TEMPLATE,
                        },
                    },
                },
            },
        },
    },
}


def pod_templates(cluster: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The cluster's pod templates by where they sit (`spec.headGroupSpec.template`, ...)."""
    spec = cluster["spec"]
    found = {"spec.headGroupSpec.template": spec["headGroupSpec"]["template"]}
    for i, group in enumerate(spec["workerGroupSpecs"]):
        found[f"spec.workerGroupSpecs.{i}.template"] = group["template"]
    return found


def replica_problems(cluster: dict[str, Any]) -> list[str]:
    """Worker groups whose size is outside its bounds (KubeRay's own check; a schema cannot compare)."""
    problems = []
    for i, group in enumerate(cluster["spec"]["workerGroupSpecs"]):
        low, size, high = group["minReplicas"], group["replicas"], group["maxReplicas"]
        if not low <= size <= high:
            problems.append(
                f"spec.workerGroupSpecs.{i}: minReplicas {low} <= replicas {size} <= maxReplicas {high} "
                "does not hold"
            )
    return problems
