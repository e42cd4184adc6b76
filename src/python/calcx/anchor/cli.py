"""`calcx anchor train`: the step-time anchor, verl's ToolAgentLoop on calcx train's config.

`--help` needs nothing but the standard library; `--print-config` needs hydra-core and verl's YAML
files (verl is located, not imported); training needs the GPU stack and fails fast without a GPU.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from calcx.trainer.run.cli import (
    DEFAULT_MODEL,
    add_data_arguments,
    add_profile_argument,
    config_files,
    ready_to_train,
    run_command,
    run_interruptible,
)

NO_GPU_MESSAGE = (
    "calcx anchor train: no CUDA GPU was found on this machine ({why}). The anchor trains "
    "like calcx train: an NVIDIA GPU with torch, vLLM and verl installed."
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="calcx anchor",
        description="The step-time anchor: verl 0.9.1's own ToolAgentLoop with the MCP calculator in-process, "
        "on calcx train's model, problems, batch and limits, scored by calcx's reward.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="train")
    train = commands.add_parser(
        "train",
        help="GRPO training with verl's ToolAgentLoop (needs a CUDA GPU)",
        description="Train with verl's ToolAgentLoop. The config is calcx train's (verl's ppo_trainer defaults, "
        "then calcx/trainer/config/calcx.yaml), then calcx/anchor/config/anchor.yaml, then the "
        "--profile run, then these "
        "flags, then any KEY=VALUE overrides. No calcx server, controller or agent process is started.",
        epilog="overrides: the same Hydra-style dotlist as calcx train's (e.g. data.train_batch_size=32 "
        "calcx.report_dir=results/anchor); metrics go to calcx.report_dir/metrics.jsonl.",
    )
    add_data_arguments(train)
    train.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"policy model: a local Hugging Face model directory or a hub id (default {DEFAULT_MODEL})",
    )
    train.add_argument(
        "--run-name", default=None, help="experiment name: checkpoint and report directory name (default calcx-anchor)"
    )
    train.add_argument(
        "--chat-template",
        default=None,
        metavar="PATH|hermes",
        help="Jinja chat template for vLLM and verl's tokenizer, as calcx train's (default: the model's own)",
    )
    add_profile_argument(train)
    train.add_argument("--print-config", action="store_true", help="print the composed config and exit; needs no GPU")
    train.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, applied last")
    return parser


def compose_from_args(args: argparse.Namespace):
    from calcx.anchor.config import compose_anchor
    from calcx.trainer.config.compose import ComposeRequest

    return compose_anchor(
        ComposeRequest(
            model=args.model,
            train_files=config_files(args.train_file),
            val_files=config_files(args.val_file),
            run_name=args.run_name,
            chat_template=args.chat_template,
            run_profile=args.profile,
            dotlist=list(args.overrides),
        )
    )


def _train(args: argparse.Namespace) -> int:
    if not ready_to_train(NO_GPU_MESSAGE):
        return 3
    from calcx.anchor.launch import run_anchor
    from calcx.trainer.config.compose import ConfigError
    from calcx.trainer.run import data as data_mod

    def train() -> int:
        train_src, val_src = list(args.train_file), list(args.val_file)
        for path in train_src + val_src:
            data_mod.ensure_generated(path)
        return run_anchor(compose_from_args(args), train_src=train_src, val_src=val_src)

    # bad data rows are ValueErrors
    return run_interruptible("calcx anchor train", train, (ConfigError, FileNotFoundError, ValueError))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    return run_command("calcx anchor train", args, compose_from_args, _train)


if __name__ == "__main__":
    raise SystemExit(main())
