"""The trainer Pants builds on a CPU machine (`src/python/calcx:train`, the CPU torch build): it
prints its options and refuses to train with the no-GPU message, before it starts or writes
anything. On a machine with an NVIDIA GPU `./pants` builds the same target against the CUDA
resolve instead (README, docs/build.md); that build is exercised on the GPU machine, not here.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

PEX = Path("src.python.calcx/train.pex")  # where Pants puts the runtime package beside the test

pytestmark = pytest.mark.skipif(
    not PEX.exists(),
    reason="runs the Pants-built train.pex (runtime_package_dependencies); outside Pants it is not built",
)


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    return subprocess.run([str(PEX.resolve()), *args], capture_output=True, text=True, timeout=600, env=env, cwd=cwd)


def test_cpu_build_prints_its_options(tmp_path: Path) -> None:
    done = _run("--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "--model" in done.stdout and "--async" in done.stdout and "KEY=VALUE" in done.stdout


def test_cpu_build_refuses_to_train_and_says_why(tmp_path: Path) -> None:
    done = _run(
        "--model",
        str(tmp_path / "model"),
        "--train-file",
        str(tmp_path / "train.parquet"),
        "--val-file",
        str(tmp_path / "val.parquet"),
        cwd=tmp_path,
    )
    assert done.returncode == 3, done.stderr
    # the CPU build's own reason, not a hidden device: its torch has no CUDA at all
    assert "no CUDA GPU was found on this machine (torch was built without CUDA)" in done.stderr
    assert "calcx rehearse" in done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing generated, started or written
