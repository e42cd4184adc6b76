"""The pex arguments a `slim_pex_binary` adds to Pants' own PEX build, from its field values.

No Pants import here, so the rule is tested without Pants (tests/pants_plugins): the plugin's
resolve is Pants' own (CPython 3.9), which calcx's test resolves cannot load.
"""

from __future__ import annotations

from collections.abc import Iterable


def slim_pex_args(
    *,
    excludes: Iterable[str],
    inherit_path: str | None,
    venv: bool,
    include_tools: bool,
    strip_env: bool | None,
) -> tuple[str, ...]:
    """`--exclude` per left-out requirement, then the `pex_binary` fields Pants 2.17 would have
    turned into arguments itself (an unset field adds nothing: pex's default applies)."""
    args = [f"--exclude={req}" for req in excludes]
    if inherit_path is not None:
        args.append(f"--inherit-path={inherit_path}")
    if venv:
        args.extend(("--venv", "prepend"))
    if include_tools:
        args.append("--include-tools")
    if strip_env is False:
        args.append("--no-strip-pex-env")
    return tuple(args)
