"""Offline schema validation of rendered manifests with kubernetes-validate (strict mode).

Strict schemas reject unknown fields, so a misspelled key (`restartPolicyy`) fails here
instead of being dropped silently by the API server. A custom resource (KubeRay's RayCluster) is
checked against calcx's own schema of it (calcx.k8s.ray_schema), and each pod template in it
against the strict Kubernetes PodTemplate schema.
"""

from __future__ import annotations

from typing import Any

import jsonschema  # kubernetes-validate's own validator library
import kubernetes_validate

from calcx.k8s import ray_schema

#: The Kubernetes minor version validated against by default (kind's node images track it).
DEFAULT_K8S_VERSION = "1.31"
#: Kinds that are not Kubernetes API objects and have no schema (checked by the renderer).
NON_API_KINDS = frozenset({"Kustomization"})


class ManifestInvalid(ValueError):
    """A manifest does not match the Kubernetes schema; the message names the field."""


def _path(error: Any) -> str:
    parts = [str(p) for p in getattr(error, "absolute_path", []) or getattr(error, "path", [])]
    return ".".join(parts) or "<root>"


def validate_manifest(obj: dict[str, Any], *, version: str = DEFAULT_K8S_VERSION, source: str = "manifest") -> None:
    """Raise ManifestInvalid unless `obj` is valid for Kubernetes `version` (strict)."""
    if obj.get("kind") in NON_API_KINDS:
        return
    if (obj.get("apiVersion"), obj.get("kind")) == (ray_schema.API_VERSION, ray_schema.KIND):
        _validate_ray_cluster(obj, version=version, source=source)
        return
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.utils.ValidationError as exc:
        raise ManifestInvalid(
            f"{source}: {obj.get('kind')} {obj.get('metadata', {}).get('name')!r} is not valid for "
            f"Kubernetes {version}: at {_path(exc)}: {exc.message}"
        ) from None
    except kubernetes_validate.utils.SchemaNotFoundError as exc:
        raise ManifestInvalid(f"{source}: {exc.message}") from None
    except kubernetes_validate.utils.VersionNotSupportedError as exc:
        raise ManifestInvalid(
            f"{source}: {exc.message}; supported: {', '.join(kubernetes_validate.utils.all_versions())}"
        ) from None


def _message(error: Any) -> str:
    # a `not` message quotes the whole instance: here an env entry, whose value may be a key
    if error.validator == "not":
        return "a key must come from a Secret (valueFrom.secretKeyRef), never a plain value"
    return str(error.message)


def _validate_ray_cluster(obj: dict[str, Any], *, version: str, source: str) -> None:
    """calcx's RayCluster schema, the worker groups' bounds, then each pod template (strict)."""
    name = f"{obj.get('kind')} {obj.get('metadata', {}).get('name')!r}"
    validator = jsonschema.Draft202012Validator(ray_schema.RAY_CLUSTER_SCHEMA)
    errors = sorted(validator.iter_errors(obj), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        raise ManifestInvalid(
            "\n".join(
                f"{source}: {name} does not match calcx's {ray_schema.KIND} schema: at {_path(e)}: {_message(e)}"
                for e in errors
            )
        )
    problems = ray_schema.replica_problems(obj)
    if problems:
        raise ManifestInvalid("\n".join(f"{source}: {name}: {p}" for p in problems))
    for where, template in ray_schema.pod_templates(obj).items():
        pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "template"}, "template": template}
        validate_manifest(pod, version=version, source=f"{source} {where}")


def validate_all(manifests: dict[str, dict[str, Any]], *, version: str = DEFAULT_K8S_VERSION) -> None:
    """Validate every manifest; the error lists all invalid ones, not just the first."""
    problems = []
    for source, obj in manifests.items():
        try:
            validate_manifest(obj, version=version, source=source)
        except ManifestInvalid as exc:
            problems.append(str(exc))
    if problems:
        raise ManifestInvalid("\n".join(problems))
