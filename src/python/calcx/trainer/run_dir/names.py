"""The names of what a run keeps in its report directory (`calcx.report_dir`, runs/NAME), the one
place they are spelled: the driver writes most of them, verl's Ray workers the per-step files,
resume sets the per-step files aside and the run report reads them back."""

from __future__ import annotations

#: verl's file logger's lines, one per step and validation (`VERL_FILE_LOGGER_PATH`)
METRICS_FILE = "metrics.jsonl"
#: one line per GRPO group left out of its step (a member could not be trained on)
INCOMPLETE_GROUPS_FILE = "incomplete_groups.jsonl"
#: when verl started each training session and when it returned
SESSION_TIMES_FILE = "session_times.jsonl"
#: each rollout's calculator use, read back into the step's `calcx/{train,val}/...` metrics
TOOL_USE_FILE = "tool_use.jsonl"
#: the files above: one line per step, cut back to the checkpoint a resumed run starts from
STEP_FILES = (METRICS_FILE, INCOMPLETE_GROUPS_FILE, TOOL_USE_FILE, SESSION_TIMES_FILE)
#: one line per start of the run (resume)
STARTS_FILE = "starts.jsonl"
#: where a resumed run sets aside the step rows after its checkpoint
SUPERSEDED_DIR = "superseded"
#: the server and controller a run starts: their database, logs and the agents' output
SERVICES_DIR = "services"
#: the directory of the server key file (mode 0700) and the file in it
KEY_DIR = ".server-key"
KEY_FILE = "server.key"
#: the Calc-X rows in verl's layout, as verl's RLHFDataset reads them
VERL_TRAIN_FILE = "verl_train.parquet"
VERL_VAL_FILE = "verl_val.parquet"
#: the run report, the validation table by source, and the curves' picture
REPORT_FILE = "report.md"
EVAL_FILE = "eval.md"
CURVE_FILE = "reward_curve.png"
#: written into a verl checkpoint's `global_step_N/` once its save returned
CHECKPOINT_MARKER = "calcx_complete.json"
#: `calcx warmup`'s run directory: the composed SFT config (`warmup_config.yaml`) and the metrics
WARMUP_CONFIG_NAME = "warmup_config"
WARMUP_METRICS_FILE = "warmup_metrics.jsonl"
