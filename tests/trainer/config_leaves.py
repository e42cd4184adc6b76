"""A composed config as its leaves (dotted key -> value), to say which keys two configs differ in."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf


def leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node, resolve=False)
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(leaves(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: node}


def differing(a: DictConfig, b: DictConfig) -> set[str]:
    la, lb = leaves(a), leaves(b)
    return {k for k in la.keys() | lb.keys() if la.get(k, "<absent>") != lb.get(k, "<absent>")}
