"""Run `calcx anchor train`: verl-layout files for the ToolAgentLoop, the file logger, verl's own
checks and V1 trainer (calcx train's run path, less the rollout services), then the run report.
"""

from __future__ import annotations

from omegaconf import DictConfig

from calcx.anchor.data import anchor_records
from calcx.trainer.config.compose import agent_prompt
from calcx.trainer.run.data import Sources
from calcx.trainer.run.launch import run_then_report, run_verl
from calcx.trainer.run.report import write_report
from calcx.trainer.run.run_settings import prepare_run


def run_anchor(cfg: DictConfig, *, train_src: Sources, val_src: Sources) -> int:
    """Train and write the report (metrics, reward curve); 0 when both succeeded."""
    prompt = agent_prompt(cfg)
    settings = prepare_run(cfg, train_src=train_src, val_src=val_src, records=lambda rows: anchor_records(rows, prompt))
    settings.apply(cfg)
    report_dir, metrics_path = settings.report_dir, settings.metrics_path

    def report() -> str:
        path = write_report(
            report_dir,
            metrics_path=metrics_path,
            eval_records=None,
            allow_no_reward=True,
            title=f"Anchor run {cfg.trainer.experiment_name} (verl's ToolAgentLoop)",
        )
        return f"report in {path}, metrics in {metrics_path}"

    run_then_report("calcx anchor train", lambda: run_verl(cfg), report)
    return 0
