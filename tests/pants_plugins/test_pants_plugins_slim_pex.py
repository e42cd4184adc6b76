"""The `slim_pex_binary` plugin (pants-plugins/calcx_pants): the pex arguments it adds, and its
use of Pants' public names only. Pants runs the plugin under its own Python 3.9, which calcx's
test resolves cannot load, so the rule is tested here without Pants; `./pants help
slim_pex_binary` shows its fields."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

PLUGIN = Path(__file__).resolve().parents[2] / "pants-plugins" / "calcx_pants"


def _load_pex_args():
    spec = importlib.util.spec_from_file_location("calcx_pants_pex_args", PLUGIN / "pex_args.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


slim_pex_args = _load_pex_args().slim_pex_args


def test_each_excluded_requirement_becomes_one_exclude_in_order() -> None:
    args = slim_pex_args(
        excludes=["torch", "nvidia-cudnn-cu12"], inherit_path=None, venv=False, include_tools=False, strip_env=None
    )
    assert args == ("--exclude=torch", "--exclude=nvidia-cudnn-cu12")


def test_the_gpu_trainer_settings_give_venv_tools_and_the_kept_pex_env() -> None:
    args = slim_pex_args(excludes=["torch"], inherit_path="fallback", venv=True, include_tools=True, strip_env=False)
    assert args == (
        "--exclude=torch",
        "--inherit-path=fallback",
        "--venv",
        "prepend",
        "--include-tools",
        "--no-strip-pex-env",
    )


def test_unset_fields_add_nothing_so_pex_defaults_apply() -> None:
    assert slim_pex_args(excludes=(), inherit_path=None, venv=False, include_tools=False, strip_env=None) == ()
    # strip_pex_env=True is pex's own default: no flag for it
    assert slim_pex_args(excludes=(), inherit_path=None, venv=False, include_tools=False, strip_env=True) == ()


def test_the_plugin_imports_no_private_pants_name() -> None:
    private = [
        f"{path.name}:{node.lineno}: {node.module}.{alias.name}"
        for path in sorted(PLUGIN.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pants")
        for alias in node.names
        if alias.name.startswith("_") or any(part.startswith("_") for part in (node.module or "").split("."))
    ]
    assert len(list(PLUGIN.glob("*.py"))) >= 3  # __init__, register, pex_args
    assert private == []
