"""`calcx train --gpus/--nnodes/--ray-address/--services-host`: the flags reach the config, a bad
count is refused by name, and on a Ray cluster nothing starts before the server is reachable by
every node and runs with the nodes' key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from calcx.trainer.config.compose import ComposeRequest, compose
from calcx.trainer.config.scale import RAY_ADDRESS_ENV
from calcx.trainer.run.launch import LaunchError, rollout_services

REPO = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src" / "python")}
KEY = "calcx-cluster-" + "5" * 48


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "calcx.trainer.run.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
        cwd=REPO,
    )


def test_the_flags_reach_verls_keys() -> None:
    done = _cli(
        "--gpus", "8", "--nnodes", "2", "--ray-address", "head:6379", "--services-host", "10.0.0.1", "--print-config"
    )
    assert done.returncode == 0, done.stderr
    cfg = yaml.safe_load(done.stdout)
    assert (cfg["trainer"]["n_gpus_per_node"], cfg["trainer"]["nnodes"]) == (8, 2)
    assert cfg["ray_kwargs"]["ray_init"]["address"] == "head:6379"
    assert cfg["calcx"]["services_host"] == "10.0.0.1"


@pytest.mark.parametrize(("flag", "value", "what"), [("--gpus", "0", "GPUs a node"), ("--nnodes", "two", "nodes")])
def test_a_count_below_one_is_refused_with_the_flag(flag: str, value: str, what: str) -> None:
    done = _cli(flag, value, "--print-config")
    assert done.returncode == 2
    assert f"argument {flag}" in done.stderr and f"the number of {what} must be a whole number >= 1" in done.stderr


def test_a_batch_that_does_not_split_is_refused_before_anything_starts() -> None:
    done = _cli("--gpus", "3", "--print-config")
    assert done.returncode == 2
    assert "does not split evenly over 3 data-parallel GPUs" in done.stderr and "ppo_mini_batch_size" in done.stderr


def _cluster_cfg(**kwargs):
    return compose(ComposeRequest(gpu_memory_gib=0, gpus_per_node=8, nnodes=2, ray_address="head:6379", **kwargs))


def test_on_a_cluster_a_loopback_server_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="--services-host"):
        with rollout_services(_cluster_cfg(), tmp_path, KEY):
            pass
    assert not (tmp_path / "services").exists()  # nothing was started


def test_on_a_cluster_the_started_server_takes_the_nodes_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RAY_ADDRESS_ENV, raising=False)
    with pytest.raises(LaunchError, match="CALCX_KEY .* to it"):
        with rollout_services(_cluster_cfg(services_host="10.0.0.1"), tmp_path, ""):
            pass
    assert not (tmp_path / "services").exists()


@pytest.mark.parametrize(
    "cluster", [["--ray-address", "head:6379"], ["+ray_kwargs.ray_init.address=head:6379"]], ids=["flag", "override"]
)
def test_the_driver_of_a_ray_cluster_needs_no_gpu_of_its_own(tmp_path: Path, cluster: list[str]) -> None:
    """Where no GPU is (KubeRay's head), a cluster named by `--ray-address` or by the override of the
    key it sets goes past the GPU check that stops a run on one machine with status 3, and on to the
    cluster's own rules (here: a loopback server)."""
    from calcx.data.generator import generate_split
    from calcx.data.io import write_rows

    rows = tmp_path / "rows.jsonl"
    write_rows(generate_split("train", 2, seed=3), rows)
    args = ["--train-file", str(rows), "--val-file", str(rows), "--nnodes", "2"]
    flags, overrides = (cluster, []) if cluster[0].startswith("--") else ([], cluster)
    env = {**ENV, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "calcx.trainer.run.cli",
            *args,
            *flags,
            f"calcx.report_dir={tmp_path / 'run'}",
            *overrides,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert "no CUDA GPU" not in done.stderr and "--services-host" in done.stderr
    assert not (tmp_path / "run" / "services").exists()  # nothing was started
