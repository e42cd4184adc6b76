"""`calcx warmup`: a supervised warm-up on the agent's tool-use traces with verl 0.9.1's own SFT
trainer, from the same build as `calcx train` (the `gpu` PEX on a GPU machine).

    calcx data traces gsm8k/train.jsonl --out traces.parquet
    calcx warmup --model DIR --traces traces.parquet [--val-traces F] [--run-name N] [KEY=VALUE ...]
    calcx train --model runs/calcx-warmup/checkpoints/global_step_N/huggingface ...

The config is verl's `sft_trainer_engine` (Hydra compose from verl's own YAML, verl not imported)
< `calcx/trainer/config/warmup.yaml` < the `warmup` settings of calcx.yaml's GPU profile (picked
by the GPU's memory, as `calcx train` picks it; `--gpu-profile`) < the flags < the dotlist, written to
`{run dir}/warmup_config.yaml`; the run is verl's trainer under torchrun, one process per GPU:
`python -m torch.distributed.run --standalone --nnodes 1 --nproc_per_node N -m
verl.trainer.sft_trainer --config-path RUN_DIR --config-name warmup_config`. Without a CUDA GPU it
exits with status 3 before starting anything; `--print-config` needs no GPU.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from calcx.trainer.config.compose import (
    CALCX_OVERRIDES,
    PACKAGE_CONFIG_DIR,
    ConfigError,
    _apply_file,
    _apply_sections,
    _set,
    chat_template_path,
    gpu_memory_gib,
    parse_dotlist_item,
    profile_new_key_hint,
    resolve_model_path,
    verl_config_dir,
    warmup_gpu_overrides,
)
from calcx.trainer.run_dir.names import WARMUP_CONFIG_NAME, WARMUP_METRICS_FILE

WARMUP_OVERRIDES = PACKAGE_CONFIG_DIR / "warmup.yaml"
SFT_CONFIG_NAME = "sft_trainer_engine"
SFT_MODULE = "verl.trainer.sft_trainer"
#: where the composed config says which GPU profile's warm-up settings it took
GPU_PROFILE_KEY = "calcx_gpu_profile"


@dataclass
class WarmupRequest:
    model: str | None = None
    traces: str | None = None
    val_traces: str | None = None
    run_name: str | None = None
    chat_template: str | None = None
    dotlist: list[str] = field(default_factory=list)
    # calcx.yaml's GPU profile whose `warmup` settings apply: auto (by the GPU's memory), none, a
    # name; None: the one calcx.yaml's `calcx.gpu_profile` names, as for calcx train
    gpu_profile: str | None = None
    # the GPU's memory in GiB for `auto` (None: ask nvidia-smi; 0: no GPU)
    gpu_memory_gib: float | None = None


def compose_warmup(request: WarmupRequest) -> DictConfig:
    """verl's SFT defaults < warmup.yaml < the GPU profile's `warmup` settings < flags < dotlist (a
    misspelt key is an error naming it). The profile applied is `calcx_gpu_profile` in the result."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        cfg = hydra_compose(config_name=SFT_CONFIG_NAME)
    GlobalHydra.instance().clear()
    _apply_file(cfg, WARMUP_OVERRIDES, config_name=SFT_CONFIG_NAME)
    memory = gpu_memory_gib() if request.gpu_memory_gib is None else request.gpu_memory_gib
    profile, settings = warmup_gpu_overrides(request.gpu_profile, memory)
    _apply_sections(
        cfg,
        {"overrides": settings},
        f"{CALCX_OVERRIDES.name} gpu_profiles.{profile}.warmup",
        config_name=SFT_CONFIG_NAME,
        new_key_hint=profile_new_key_hint(WARMUP_OVERRIDES),
    )
    _set(cfg, GPU_PROFILE_KEY, profile or "none", must_exist=False, origin="calcx", config_name=SFT_CONFIG_NAME)
    flags = {
        "model.path": request.model,
        "data.train_files": request.traces,
        "data.val_files": request.val_traces,
        "trainer.experiment_name": request.run_name,
    }
    for dotted, value in flags.items():
        if value is not None:
            _set(cfg, dotted, value, must_exist=True, origin="command line flag", config_name=SFT_CONFIG_NAME)
    if request.chat_template:
        # the template's text on the tokenizer renders the traces (verl's HFModelConfig applies it)
        text = chat_template_path(request.chat_template).read_text(encoding="utf-8")
        _set(
            cfg,
            "model.custom_chat_template",
            text,
            must_exist=True,
            origin="--chat-template",
            config_name=SFT_CONFIG_NAME,
        )
    for item in request.dotlist:
        key, value, add = parse_dotlist_item(item)
        _set(cfg, key, value, must_exist=not add, origin=f"override {item!r}", config_name=SFT_CONFIG_NAME)
    return cfg


def run_dir(cfg: DictConfig) -> Path:
    """Where the composed config and the metrics file go: `runs/{experiment_name}` (absolute)."""
    return (Path("runs") / str(cfg.trainer.experiment_name)).resolve()


def prepare_run(cfg: DictConfig) -> tuple[Path, dict[str, str]]:
    """Check the inputs, make paths absolute, write the composed config; (its path, the env to add)."""
    for key in ("data.train_files", "data.val_files"):
        value = OmegaConf.select(cfg, key)
        if value is None:
            continue
        path = Path(str(value)).expanduser()
        if not path.is_file():
            raise ConfigError(f"{key}: {path} does not exist; make it with `calcx data traces`")
        OmegaConf.update(cfg, key, str(path.resolve()), merge=False)
    OmegaConf.update(cfg, "model.path", resolve_model_path(str(cfg.model.path)), merge=False)
    out = run_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    OmegaConf.update(
        cfg,
        "trainer.default_local_dir",
        str(Path(str(cfg.trainer.default_local_dir)).expanduser().resolve()),
        merge=False,
    )
    composed = out / f"{WARMUP_CONFIG_NAME}.yaml"
    OmegaConf.save(cfg, composed, resolve=True)
    return composed, {"VERL_FILE_LOGGER_PATH": str(out / WARMUP_METRICS_FILE)}


def warmup_command(composed: Path, nproc_per_node: int, python: str = sys.executable) -> list[str]:
    """verl's SFT trainer under torchrun, one process per GPU, reading the composed config."""
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc_per_node",
        str(nproc_per_node),
        "-m",
        SFT_MODULE,
        "--config-path",
        str(composed.parent),
        "--config-name",
        composed.stem,
    ]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="calcx warmup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a local Hugging Face model directory or hub id (model.path)")
    parser.add_argument("--traces", help="train traces (`calcx data traces` output, .parquet)")
    parser.add_argument("--val-traces", help="validation traces (optional)")
    parser.add_argument("--run-name", help="trainer.experiment_name: runs/NAME holds the config, metrics, checkpoints")
    parser.add_argument(
        "--chat-template",
        help="a Jinja chat template for the tokenizer, or 'hermes' (default: the "
        "model's own; use the one `calcx train` runs with)",
    )
    parser.add_argument(
        "--gpu-profile",
        metavar="NAME",
        help="the calcx.yaml GPU profile whose `warmup` settings apply: auto (by the GPU's memory), "
        "none, or a profile's name (default: calcx.yaml's calcx.gpu_profile, as for calcx train)",
    )
    parser.add_argument("--print-config", action="store_true", help="print the composed config and exit; no GPU needed")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotlist overrides, applied last")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    request = WarmupRequest(
        model=args.model,
        traces=args.traces,
        val_traces=args.val_traces,
        run_name=args.run_name,
        chat_template=args.chat_template,
        dotlist=list(args.overrides),
        gpu_profile=args.gpu_profile,
    )
    try:
        cfg = compose_warmup(request)
    except ConfigError as exc:
        print(f"calcx warmup: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        sys.stdout.write(OmegaConf.to_yaml(cfg))
        return 0
    from calcx.trainer.run.cli import cuda_problem

    problem = cuda_problem()
    if problem is not None:
        print(
            f"calcx warmup: no CUDA GPU was found on this machine ({problem}); verl's SFT trainer needs one. "
            "--print-config shows the composed config without it.",
            file=sys.stderr,
        )
        return 3
    try:
        composed, env = prepare_run(cfg)
    except ConfigError as exc:
        print(f"calcx warmup: {exc}", file=sys.stderr)
        return 2
    command = warmup_command(composed, int(cfg.trainer.n_gpus_per_node))
    print(f"calcx warmup: GPU profile {cfg[GPU_PROFILE_KEY]}; {' '.join(command)}", flush=True)
    return subprocess.call(command, env={**os.environ, **env})


if __name__ == "__main__":
    raise SystemExit(main())
