"""What a run adds to its composed config is resolved first and written in one step: resolving
changes nothing in the config, applying writes exactly the resolved values, the user's worker
environment wins, and a bad model stops the run before any file is written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from calcx.trainer.config.compose import ComposeRequest, ConfigError, compose
from calcx.trainer.run.run_settings import FILE_LOGGER_ENV, WORKER_ENV_KEY, prepare_run
from calcx.trainer.run.services import CALCX_SRC

ROW = {"id": "r1", "source": "gsm8k", "question": "What is 2 + 3?", "chain": "<gadget>2+3</gadget>", "result": "5"}


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(FILE_LOGGER_ENV, raising=False)  # prepare_run sets it for verl's driver
    monkeypatch.setenv("PYTHONPATH", "")
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(ROW) + "\n")
    return path


def _cfg(report_dir: Path, *dotlist: str):
    return compose(ComposeRequest(gpu_memory_gib=0, dotlist=[f"calcx.report_dir={report_dir}", *dotlist]))


def test_resolving_changes_nothing_and_applying_writes_every_value(tmp_path: Path, data: Path) -> None:
    cfg = _cfg(tmp_path / "report")
    before = OmegaConf.to_yaml(cfg)
    settings = prepare_run(cfg, train_src=data, val_src=data)
    assert OmegaConf.to_yaml(cfg) == before  # nothing written yet
    assert settings.report_dir == (tmp_path / "report").resolve()
    assert settings.metrics_path == settings.report_dir / "metrics.jsonl"
    assert os.environ[FILE_LOGGER_ENV] == str(settings.metrics_path)
    assert (settings.report_dir / "verl_train.parquet").is_file() and (
        settings.report_dir / "verl_val.parquet"
    ).is_file()

    served = settings.with_server(tmp_path / "k" / "server.key", "http://127.0.0.1:9")
    served.apply(cfg)
    # the driver reads its own values from the settings, the same ones verl reads from the config
    assert (served.server_url, served.key_file) == ("http://127.0.0.1:9", tmp_path / "k" / "server.key")
    assert served.model_path == cfg.actor_rollout_ref.model.path
    assert cfg.data.train_files == str(settings.report_dir / "verl_train.parquet")
    assert cfg.data.val_files == str(settings.report_dir / "verl_val.parquet")
    assert cfg.calcx.report_dir == str(settings.report_dir)
    assert list(cfg.trainer.logger) == ["console", "file"]
    assert cfg.calcx.server_url == "http://127.0.0.1:9" and cfg.calcx.key_file == str(tmp_path / "k" / "server.key")
    env = OmegaConf.to_container(OmegaConf.select(cfg, WORKER_ENV_KEY))
    assert env == {"PYTHONPATH": str(CALCX_SRC), FILE_LOGGER_ENV: str(settings.metrics_path)}
    assert cfg.trainer.val_only is False  # a training run


def test_the_configured_server_and_the_users_worker_env_are_kept(tmp_path: Path, data: Path) -> None:
    cfg = _cfg(tmp_path, "calcx.server_url=http://127.0.0.1:7", f"+{WORKER_ENV_KEY}.PYTHONPATH=/mine")
    settings = prepare_run(cfg, train_src=data, val_src=data)
    served = settings.with_server(tmp_path / "server.key")
    served.apply(cfg)
    assert cfg.calcx.server_url == "http://127.0.0.1:7" == served.server_url
    assert dict(OmegaConf.select(cfg, WORKER_ENV_KEY)) == {
        "PYTHONPATH": "/mine",
        FILE_LOGGER_ENV: str(settings.metrics_path),
    }


def test_validate_only_switches_verl_to_validation(tmp_path: Path, data: Path) -> None:
    cfg = _cfg(tmp_path, "trainer.val_before_train=false")
    prepare_run(cfg, train_src=data, val_src=data, validate_only=True).apply(cfg)
    assert cfg.trainer.val_only is True and cfg.trainer.val_before_train is True


def test_several_files_make_one_verl_file_and_an_id_in_two_is_refused(tmp_path: Path, data: Path) -> None:
    import pyarrow.parquet as pq

    hard = tmp_path / "hard.jsonl"
    hard.write_text(json.dumps({**ROW, "id": "r1-hard", "source": "gsm8k-hard", "result": "5000"}) + "\n")
    settings = prepare_run(_cfg(tmp_path / "report"), train_src=[data], val_src=[data, hard])
    rows = pq.read_table(settings.report_dir / "verl_val.parquet").to_pylist()
    assert [(r["extra_info"]["id"], r["data_source"]) for r in rows] == [("r1", "gsm8k"), ("r1-hard", "gsm8k-hard")]
    assert pq.read_table(settings.report_dir / "verl_train.parquet").num_rows == 1
    with pytest.raises(ValueError, match=r"row id 'r1' is also in .*rows.jsonl; ids must be unique"):
        prepare_run(_cfg(tmp_path / "report2"), train_src=[data, data], val_src=data)


def test_the_cli_takes_several_files_for_each_flag() -> None:
    from calcx.trainer.run.cli import build_parser, config_files

    args = build_parser().parse_args(["--train-file", "a.parquet", "b.parquet", "--val-file", "v.parquet"])
    assert (config_files(args.train_file), config_files(args.val_file)) == (["a.parquet", "b.parquet"], "v.parquet")


def test_a_bad_model_directory_stops_the_run_before_any_file(tmp_path: Path, data: Path) -> None:
    cfg = _cfg(tmp_path / "report", f"actor_rollout_ref.model.path={tmp_path / 'no-model'}")
    before = OmegaConf.to_yaml(cfg)
    with pytest.raises(ConfigError, match="no such directory"):
        prepare_run(cfg, train_src=data, val_src=data)
    assert OmegaConf.to_yaml(cfg) == before
    assert not list((tmp_path / "report").glob("*.parquet"))
