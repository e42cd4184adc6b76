"""Offline schema validation of rendered manifests with kubernetes-validate (strict mode).

Strict schemas reject unknown fields, so a misspelled key (`restartPolicyy`) fails here
instead of being dropped silently by the API server.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate

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
