"""calcx server: rollout store, claims, events, model registry and the recording gateway."""

from __future__ import annotations

try:  # the product version when the calcx package defines one
    from calcx import __version__ as __version__  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the package layout
    __version__ = "0.1.0"
