"""The fault tests reuse benchmarks/faults.py (hostile inputs, hostile client, fault proxy,
audit), loaded from its path so that the benchmark and the tests check the same things."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "faults.py"


def load_faults() -> ModuleType:
    name = "calcx_faults_bench"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCH)
    assert spec is not None and spec.loader is not None, f"cannot load {BENCH}"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def faults() -> ModuleType:
    return load_faults()
