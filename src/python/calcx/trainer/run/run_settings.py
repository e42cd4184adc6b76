"""What a run adds to its composed config, resolved in one place and written in one step.

Composition (calcx.trainer.config.compose) knows only files and flags. Before verl sees the config, a run
adds what only this machine and this start know: the model directory made absolute, the
verl-layout data files, the report directory, the file logger and its metrics file, the Ray
workers' environment, `--eval-only`'s switches, and the calcx server's URL and key file (known once
the rollout services are up). `prepare_run` checks and resolves all of them into `RunSettings`;
`RunSettings.apply` writes them into the config at once. The driver keeps the frozen settings and
reads its own values (model directory, server URL and key file, paths) from them, not from the config.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from calcx.trainer.config.compose import OWNER_KEY, resolve_model_path
from calcx.trainer.run.data import Sources, to_verl_parquet, verl_records
from calcx.trainer.run.services import CALCX_SRC
from calcx.trainer.run_dir.names import METRICS_FILE, VERL_TRAIN_FILE, VERL_VAL_FILE
from calcx.trainer.run_dir.server_key import KEY_FROM_ENV, server_key

WORKER_ENV_KEY = "ray_kwargs.ray_init.runtime_env.env_vars"
FILE_LOGGER_ENV = "VERL_FILE_LOGGER_PATH"  # where verl's `file` logger writes (its FileLogger)

Records = Callable[[Sequence[dict[str, Any]]], list[dict[str, Any]]]


@dataclass(frozen=True)
class RunSettings:
    """Dotted config key -> value, in the order they are written (what verl and its workers read),
    and what the driver itself uses: the run's two paths and, once known, the server's URL and key file."""

    report_dir: Path
    metrics_path: Path
    values: Mapping[str, Any]
    model_path: str = ""  # the model directory, absolute
    server_url: str = ""  # the configured server (`calcx.server_url`), or the one this run started
    key_file: Path | None = None

    def with_server(
        self, key_file: Path, url: str | None = None, owner: str = "", *, key_from_env: bool = False
    ) -> RunSettings:
        """The owner-only file that holds the calcx server's key, the URL of a server this run
        started (None: the configured server), and the owner id of the run's lease (the ledger's
        writers in Ray's workers name it). `key_from_env` (a Ray cluster): the file is the driver's
        alone, and the workers read CALCX_KEY on their own nodes."""
        server = {"calcx.server_url": url} if url is not None else {}
        lease = {OWNER_KEY: owner} if owner else {}
        key = (
            {"calcx.key_file": None, f"calcx.{KEY_FROM_ENV}": True}
            if key_from_env
            else {"calcx.key_file": str(key_file)}
        )
        return dataclasses.replace(
            self,
            values={**self.values, **server, **lease, **key},
            server_url=url if url is not None else self.server_url,
            key_file=key_file,
        )

    def server_key(self) -> str:
        """The calcx server's key, read from the key file."""
        return server_key({"key_file": self.key_file})

    def apply(self, cfg: DictConfig) -> None:
        """Write every value into `cfg` (one `open_dict`: some keys are new to verl's schema)."""
        with open_dict(cfg):
            for dotted, value in self.values.items():
                OmegaConf.update(cfg, dotted, value, merge=False, force_add=True)


def worker_pythonpath() -> str:
    """calcx's source root, then this process's PYTHONPATH entries made absolute (Ray workers do
    not run in our working directory), for the workers where verl instantiates CalcxAgentLoop."""
    parts = [str(CALCX_SRC)]
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if entry.strip():
            absolute = str(Path(entry).expanduser().resolve())
            if absolute not in parts:
                parts.append(absolute)
    return os.pathsep.join(parts)


def worker_env(cfg: DictConfig, env: Mapping[str, str]) -> dict[str, Any]:
    """`env` for the runtime_env verl passes to `ray.init`, as dotted config keys, less the names
    the user set there (theirs win)."""
    present = OmegaConf.select(cfg, WORKER_ENV_KEY)
    values: dict[str, Any] = {WORKER_ENV_KEY: {}} if present is None else {}
    taken = set(present.keys()) if present is not None else set()
    values.update({f"{WORKER_ENV_KEY}.{name}": value for name, value in env.items() if name not in taken})
    return values


def prepare_run(
    cfg: DictConfig,
    *,
    train_src: Sources,
    val_src: Sources,
    records: Records = verl_records,
    validate_only: bool = False,
) -> RunSettings:
    """Check the model, write the verl-layout data files (`records` of the Calc-X rows) and point
    verl's file logger at the metrics file; return what the run sets, not yet applied.
    `validate_only`: verl validates and does not train (`--eval-only` without a model endpoint)."""
    report_dir = Path(str(cfg.calcx.report_dir)).expanduser().resolve()
    report_dir.mkdir(parents=True, exist_ok=True)
    model_path = resolve_model_path(str(cfg.actor_rollout_ref.model.path))
    train_files = to_verl_parquet(train_src, report_dir / VERL_TRAIN_FILE, records)
    val_files = to_verl_parquet(val_src, report_dir / VERL_VAL_FILE, records)
    loggers = list(cfg.trainer.logger)
    if "file" not in loggers:
        loggers.append("file")  # the report's metrics JSONL
    metrics_path = report_dir / METRICS_FILE
    os.environ[FILE_LOGGER_ENV] = str(metrics_path)
    values: dict[str, Any] = {
        "actor_rollout_ref.model.path": model_path,
        "calcx.report_dir": str(report_dir),
        "data.train_files": str(train_files),
        "data.val_files": str(val_files),
        "trainer.logger": loggers,
        **worker_env(cfg, {"PYTHONPATH": worker_pythonpath(), FILE_LOGGER_ENV: str(metrics_path)}),
    }
    if validate_only:
        values.update({"trainer.val_before_train": True, "trainer.val_only": True})
    return RunSettings(
        report_dir=report_dir,
        metrics_path=metrics_path,
        values=values,
        model_path=model_path,
        server_url=str(cfg.calcx.get("server_url") or ""),
    )
