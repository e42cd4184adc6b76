"""The server key on several nodes: the driver's key file is on its node alone, so on a Ray cluster
the config sends every worker to its own node's CALCX_KEY, and never holds the key itself."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from calcx.trainer.config.compose import ComposeRequest, compose
from calcx.trainer.run.run_settings import RunSettings
from calcx.trainer.run_dir.server_key import NoServerKey, key_dir, remove_key_file, server_key, write_key_file

REPO = Path(__file__).resolve().parents[3]
KEY = "calcx-cluster-" + "5" * 48
OTHER = "calcx-user-shell-" + "7" * 48


def _settings(tmp_path: Path) -> RunSettings:
    return RunSettings(report_dir=tmp_path, metrics_path=tmp_path / "metrics.jsonl", values={})


def test_on_a_cluster_the_config_names_no_key_file_and_no_key(tmp_path: Path) -> None:
    key_file = write_key_file(KEY, key_dir(tmp_path))
    cfg = compose(ComposeRequest(gpu_memory_gib=0, gpus_per_node=8, nnodes=2, ray_address="head:6379"))
    settings = _settings(tmp_path).with_server(key_file, "http://10.0.0.1:8000", key_from_env=True)
    settings.apply(cfg)
    assert cfg.calcx.key_file is None and cfg.calcx.key_from_env is True
    assert KEY not in OmegaConf.to_yaml(cfg, resolve=True)
    assert settings.server_key() == KEY  # the driver still reads its own file
    remove_key_file(key_file)


def test_a_worker_on_another_node_reads_its_nodes_calcx_key(tmp_path: Path) -> None:
    """Another node: a fresh process that has the config but not the driver's key file, and
    CALCX_KEY in its environment as KubeRay's Secret gives it to every Ray container."""
    key_file = write_key_file(KEY, key_dir(tmp_path / "driver"))
    cfg = compose(ComposeRequest(gpu_memory_gib=0, gpus_per_node=8, nnodes=2, ray_address="head:6379"))
    _settings(tmp_path).with_server(key_file, "http://10.0.0.1:8000", key_from_env=True).apply(cfg)
    remove_key_file(key_file)  # not on this node
    config_path = tmp_path / "config.yaml"
    config_path.write_text(OmegaConf.to_yaml(cfg), encoding="utf-8")
    probe = (
        "import hashlib, sys; from omegaconf import OmegaConf\n"
        "from calcx.trainer.run_dir.server_key import NoServerKey, server_key\n"
        "try:\n    key = server_key(OmegaConf.load(sys.argv[1]).calcx)\n"
        "except NoServerKey as exc:\n    print(exc); raise SystemExit(3)\n"
        "print(hashlib.sha256(key.encode()).hexdigest())\n"
    )
    base = {k: v for k, v in os.environ.items() if k != "CALCX_KEY"}
    base["PYTHONPATH"] = os.pathsep.join([str(REPO / "src" / "python"), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", probe, str(config_path)],
        env={**base, "CALCX_KEY": KEY},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == hashlib.sha256(KEY.encode()).hexdigest()
    missing = subprocess.run(
        [sys.executable, "-c", probe, str(config_path)], env=base, capture_output=True, text=True, timeout=60
    )
    assert missing.returncode == 3 and "CALCX_KEY is not set on this Ray node" in missing.stdout


def test_a_node_without_calcx_key_is_told_where_it_comes_from() -> None:
    with pytest.raises(NoServerKey, match="server-key Secret") as err:
        server_key({"key_file": None, "key_from_env": True}, environ={})
    assert "CALCX_KEY" in str(err.value)


def test_one_machine_keeps_the_runs_own_key_file_over_a_calcx_key_in_the_shell(tmp_path: Path) -> None:
    key_file = write_key_file(KEY, key_dir(tmp_path))
    cfg = compose(ComposeRequest(gpu_memory_gib=0))
    _settings(tmp_path).with_server(key_file, "http://127.0.0.1:8000").apply(cfg)
    assert cfg.calcx.key_file == str(key_file) and "key_from_env" not in cfg.calcx
    assert server_key(cfg.calcx, environ={"CALCX_KEY": OTHER}) == KEY
    assert server_key({"key_file": None}, environ={"CALCX_KEY": OTHER}) == ""  # no key configured: none
    remove_key_file(key_file)


def test_on_a_cluster_the_drivers_key_file_stays_off_the_shared_run_directory(tmp_path: Path) -> None:
    """A cluster's run directory is storage every node mounts, and its workers read the key from
    their node's CALCX_KEY: the driver's key file goes to an owner-only directory of its own node."""
    import stat

    from calcx.trainer.run.launch import _key_home

    assert _key_home(tmp_path, None) == key_dir(tmp_path)
    key_file = write_key_file(KEY, _key_home(tmp_path, "head:6379"))
    try:
        assert tmp_path not in key_file.parents and key_file.read_text() == KEY
        assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700 and stat.S_IMODE(key_file.stat().st_mode) == 0o600
    finally:
        remove_key_file(key_file)
    assert not key_file.parent.exists()
