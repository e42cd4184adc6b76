"""Run `calcx anchor train`: verl-layout files for the ToolAgentLoop, the file logger, verl's own
checks and V1 trainer (calcx train's run path, less the rollout services), then the run report.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from calcx.anchor.data import anchor_records
from calcx.trainer.launch import prepare_files, run_verl
from calcx.trainer.report import write_report

log = logging.getLogger(__name__)


def run_anchor(cfg: DictConfig, *, train_src: Path, val_src: Path) -> int:
    """Train and write the report (metrics, reward curve); 0 when both succeeded."""
    report_dir = Path(str(cfg.calcx.report_dir)).expanduser().resolve()
    report_dir.mkdir(parents=True, exist_ok=True)
    metrics_path = prepare_files(cfg, report_dir, train_src=train_src, val_src=val_src, records=anchor_records)
    failure: BaseException | None = None
    try:
        run_verl(cfg)
    except BaseException as exc:  # the report is written for failed and interrupted runs too
        failure = exc
    try:
        path = write_report(report_dir, metrics_path=metrics_path, eval_records=None, allow_no_reward=True,
                            title=f"Anchor run {cfg.trainer.experiment_name} (verl's ToolAgentLoop)")
        print(f"calcx anchor train: report in {path}, metrics in {metrics_path}", flush=True)
    except Exception as exc:
        if failure is None:
            raise
        log.error("calcx anchor train: could not write the report after the run failed: %s", exc)
    if failure is not None:
        raise failure
    return 0
