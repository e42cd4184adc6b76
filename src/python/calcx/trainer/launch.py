"""Start verl on a GPU machine with a composed config, then write the run report.

GPU-only path (imports verl, ray, torch). The Calc-X files are converted to verl's layout first,
verl's own validation runs on the final config, verl's file logger writes the metrics JSONL that
the report reads.
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig, open_dict

from calcx.trainer.data import to_verl_parquet
from calcx.trainer.report import count_incomplete, write_report


def validate_with_verl(cfg: DictConfig) -> None:
    """verl's own checks, as verl.trainer.main_ppo runs them, plus its dataclass conversions."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    omega_conf_to_dataclass(cfg.algorithm)


def run_training(cfg: DictConfig, *, train_src: Path, val_src: Path) -> int:
    report_dir = Path(str(cfg.calcx.report_dir))
    report_dir.mkdir(parents=True, exist_ok=True)
    with open_dict(cfg):
        cfg.data.train_files = str(to_verl_parquet(train_src, report_dir / "verl_train.parquet"))
        cfg.data.val_files = str(to_verl_parquet(val_src, report_dir / "verl_val.parquet"))
        loggers = list(cfg.trainer.logger)
        if "file" not in loggers:
            loggers.append("file")  # the report's metrics JSONL
        cfg.trainer.logger = loggers
    metrics_path = report_dir / "metrics.jsonl"
    os.environ["VERL_FILE_LOGGER_PATH"] = str(metrics_path)
    validate_with_verl(cfg)

    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo

    run_ppo(cfg, task_runner_class=TaskRunnerV1)
    write_report(report_dir, metrics_path=metrics_path if metrics_path.exists() else None, eval_records=None,
                 incomplete_groups=count_incomplete(report_dir / "incomplete_groups.jsonl"))
    return 0
