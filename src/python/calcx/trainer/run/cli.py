"""`calcx train`: GRPO training of the Calc-X agent with verl 0.9.1.

`--help` needs nothing but the standard library; `--print-config` needs hydra-core and verl's YAML
files (verl is located, not imported); training needs the GPU stack and fails fast without a GPU.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "Qwen/Qwen2.5-1.5B-Instruct"
DEFAULT_TRAIN = "data/calcx/train.parquet"
DEFAULT_VAL = "data/calcx/test_mini.parquet"
NO_GPU_MESSAGE = (
    "calcx train: no CUDA GPU was found on this machine ({why}). Training needs an NVIDIA GPU with "
    "torch, vLLM and verl installed. To exercise the whole rollout path on CPU, run 'calcx rehearse' "
    "(the CPU rehearsal: server, controller, agent and a stub model)."
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="calcx train",
        description=(
            "Train the Calc-X agent with GRPO on verl 0.9.1. The config is verl's ppo_trainer defaults, "
            "then calcx/trainer/config/calcx.yaml (its GPU profile, then the --profile run), then these flags, "
            "then any KEY=VALUE overrides."
        ),
        epilog=(
            "overrides: Hydra-style dotlist after the flags, e.g. trainer.total_epochs=1 "
            "'trainer.logger=[console,wandb]'; '+key=value' adds a key verl does not declare; "
            "an override of a config group (e.g. model_engine=...) is passed to Hydra's compose."
        ),
    )
    add_data_arguments(parser)
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"policy model: a local Hugging Face model directory or a hub id (default {DEFAULT_MODEL})",
    )
    parser.add_argument(
        "--agl-base-url",
        default=None,
        help="a running calcx server the rollouts go to (default: calcx train starts a server "
        "and a local-runner controller itself, with a key made for the run)",
    )
    parser.add_argument(
        "--agl-key-file",
        default=None,
        metavar="FILE",
        help="file holding that server's key (default: $CALCX_KEY); never printed",
    )
    parser.add_argument("--agl-key", default=None, help=argparse.SUPPRESS)  # refused: a key on a command line
    parser.add_argument("--run-name", default=None, help="experiment name: checkpoint and report directory name")
    parser.add_argument(
        "--take-over",
        action="store_true",
        help="take the run from another calcx train holding its lease on the server (a second "
        "start of a live run is refused without it); that trainer's ledger records and "
        "cancels are refused from then on, and it stops",
    )
    parser.add_argument(
        "--async",
        dest="async_mode",
        action="store_true",
        help="asynchronous rollouts: a second train batch in flight, staleness bounded "
        "to 2 policy versions (verl V1 colocate_async)",
    )
    parser.add_argument(
        "--runner",
        choices=("local", "k8s"),
        default=None,
        help="how the controller runs each agent (recorded in the config; default local)",
    )
    parser.add_argument(
        "--chat-template",
        default=None,
        metavar="PATH|hermes",
        help="Jinja chat template for vLLM and verl's tokenizer (default: the model's own); "
        "'hermes' is the packaged Hermes tool template, for models whose template ignores tools",
    )
    parser.add_argument(
        "--eval-only",
        action="store_true",
        help="run only validation (the --val-file rows) through the same rollout path, then "
        "write eval.md; with --model-endpoint no GPU, verl or Ray is used",
    )
    parser.add_argument(
        "--model-endpoint",
        default=None,
        metavar="URL",
        help="with --eval-only: an OpenAI-compatible base URL (e.g. the stub LLM or a running "
        "vLLM, http://HOST:PORT/v1) that plays the policy instead of verl's vLLM",
    )
    add_profile_argument(parser)
    add_scale_arguments(parser)
    parser.add_argument(
        "--print-config", action="store_true", help="print the composed config (secrets masked) and exit; needs no GPU"
    )
    parser.add_argument(
        "--print-key",
        metavar="KEY",
        default=None,
        help="print one key of the composed config (e.g. calcx.agent_prompt; a section as YAML) and exit; needs no GPU",
    )
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, applied last")
    return parser


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """--train-file and --val-file, the same flags for calcx train and calcx anchor train."""
    parser.add_argument(
        "--train-file",
        nargs="+",
        type=Path,
        default=[DEFAULT_TRAIN],
        metavar="F",
        help=f"Calc-X training rows, parquet or jsonl, one file or several (default {DEFAULT_TRAIN}, "
        "generated with 'calcx data generate' when absent)",
    )
    parser.add_argument(
        "--val-file",
        nargs="+",
        type=Path,
        default=[DEFAULT_VAL],
        metavar="F",
        help="validation rows, one file or several: accuracy is reported by each row's source, "
        f"e.g. gsm8k and gsm8k-hard (default {DEFAULT_VAL})",
    )


def add_profile_argument(parser: argparse.ArgumentParser) -> None:
    """--profile, the same flag for calcx train and calcx anchor train."""
    parser.add_argument(
        "--profile",
        default=None,
        metavar="NAME",
        help="a documented run's settings: an entry of calcx.yaml's run_profiles (e.g. gsm8k-h200), "
        "applied over calcx.yaml and the GPU profile, under the flags and overrides",
    )


def whole_number_of(what: str) -> Callable[[str], int]:
    """An argparse type: a whole number >= 1, else an error that names `what`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"{text!r}: the number of {what} must be a whole number >= 1")
        return value

    return parse


def add_scale_arguments(parser: argparse.ArgumentParser) -> None:
    """--gpus, --nnodes, --ray-address, --services-host: where the run's GPUs are (docs/scale-out.md)."""
    parser.add_argument(
        "--gpus",
        type=whole_number_of("GPUs a node"),
        default=None,
        metavar="N",
        help="GPUs of each node (trainer.n_gpus_per_node; default 1): FSDP over all of them and one vLLM "
        "replica a GPU, each registered with the calcx server; the batch stays the profile's, split across "
        "the GPUs (docs/scale-out.md)",
    )
    parser.add_argument(
        "--nnodes",
        type=whole_number_of("nodes"),
        default=None,
        metavar="M",
        help="nodes of a Ray cluster (trainer.nnodes; default 1); more than one needs --ray-address "
        "or ray job submit",
    )
    parser.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="a running Ray cluster to train on (ray.init's address, e.g. HEAD:6379 or auto; default: "
        "$RAY_ADDRESS, which ray job submit sets, else a Ray of its own on this machine)",
    )
    parser.add_argument(
        "--services-host",
        default=None,
        metavar="ADDR",
        help="where the calcx server calcx train starts listens (calcx.services_host; default loopback): "
        "on a Ray cluster, this node's address that every node reaches",
    )


def config_files(paths: Sequence[Path]) -> str | list[str]:
    """verl's `data.*_files` for the flag's files: a path, or a list of them."""
    names = [str(p) for p in paths]
    return names[0] if len(names) == 1 else names


def compose_from_args(args: argparse.Namespace):
    from calcx.trainer.config.compose import ComposeRequest, compose

    return compose(
        ComposeRequest(
            model=args.model,
            train_files=config_files(args.train_file),
            val_files=config_files(args.val_file),
            server_url=args.agl_base_url,
            run_name=args.run_name,
            runner=args.runner,
            async_mode=args.async_mode,
            chat_template=args.chat_template,
            run_profile=args.profile,
            gpus_per_node=args.gpus,
            nnodes=args.nnodes,
            ray_address=args.ray_address,
            services_host=args.services_host,
            dotlist=list(args.overrides),
        )
    )


def cuda_problem() -> str | None:
    """None when a CUDA GPU is usable, else why not (checked before anything heavy is started)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return "CUDA_VISIBLE_DEVICES hides every device"
    try:
        import torch  # noqa: PLC0415  (heavy, and absent from CPU builds)
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        build = getattr(torch.version, "cuda", None)
        return "torch was built without CUDA" if build is None else "torch.cuda.is_available() is False"
    return None


def ready_to_train(no_gpu_message: str, *, needs_gpu: bool = True) -> bool:
    """False, after saying why, where a needed CUDA GPU is missing; else True, with the native
    libraries exposed before Ray and vLLM start (their processes inherit the environment)."""
    if needs_gpu:
        problem = cuda_problem()
        if problem is not None:
            print(no_gpu_message.format(why=problem), file=sys.stderr)
            return False
    from calcx.trainer.workers.native_libs import expose_native_libraries

    expose_native_libraries()
    return True


def raise_interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def _train(args: argparse.Namespace) -> int:
    from calcx.trainer.config.compose import ConfigError

    if args.model_endpoint is not None and not args.eval_only:
        print(
            "calcx train: --model-endpoint is only for --eval-only (training needs verl's own vLLM replicas)",
            file=sys.stderr,
        )
        return 2
    from calcx.trainer.config.scale import RAY_ADDRESS_ENV, RAY_ADDRESS_KEY

    # the driver of a Ray cluster needs no GPU of its own (KubeRay's head has none); the cluster is
    # named by the flag, `ray job submit`'s variable or the override of the key the flag sets
    overridden = any(item.partition("=")[0].lstrip("+") == RAY_ADDRESS_KEY for item in args.overrides)
    on_cluster = args.ray_address is not None or bool(os.environ.get(RAY_ADDRESS_ENV)) or overridden
    if not ready_to_train(NO_GPU_MESSAGE, needs_gpu=args.model_endpoint is None and not on_cluster):
        return 3
    from calcx.api.tokens import read_server_key
    from calcx.trainer.run import data as data_mod
    from calcx.trainer.run.launch import LaunchError, run_training
    from calcx.trainer.run.services import ServicesError

    def train() -> int:
        train_src, val_src = list(args.train_file), list(args.val_file)
        for path in (val_src if args.eval_only else train_src + val_src):
            data_mod.ensure_generated(path)
        cfg = compose_from_args(args)
        key = read_server_key(os.environ, args.agl_key_file, "--agl-key-file")  # kept out of cfg: verl prints it
        return run_training(
            cfg,
            train_src=train_src if not args.eval_only else val_src,
            val_src=val_src,
            eval_only=args.eval_only,
            model_endpoint=args.model_endpoint,
            key=key,
            take_over=args.take_over,
        )

    return run_interruptible(
        "calcx train",
        train,
        (ConfigError, FileNotFoundError, ValueError, LaunchError, ServicesError),
        interrupted="interrupted; every process it started was ended",
    )


def run_interruptible(
    prog: str, run: Callable[[], int], errors: tuple[type[Exception], ...], *, interrupted: str = "interrupted"
) -> int:
    """`run()` with SIGTERM unwinding like Ctrl-C, so that its cleanup runs: one of `errors` is
    status 2 and its message after `prog: `, an interrupt status 130 and `prog: interrupted`."""
    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        return run()
    except errors as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: {interrupted}", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_command(
    prog: str,
    args: argparse.Namespace,
    compose: Callable[[argparse.Namespace], Any],
    train: Callable[[argparse.Namespace], int],
) -> int:
    """What `calcx train` and `calcx anchor train` share: overrides checked, `--print-config`
    answered without a GPU, else `train(args)`."""
    bad = [item for item in args.overrides if "=" not in item]
    if bad:
        print(
            f"{prog}: {bad[0]!r} is not an override of the form KEY=VALUE " "(flags go before the overrides)",
            file=sys.stderr,
        )
        return 2
    print_key = getattr(args, "print_key", None)  # `calcx train`'s; the anchor has --print-config alone
    if args.print_config or print_key is not None:  # an empty key is refused, never a run
        from calcx.trainer.config.compose import ConfigError, config_value, redacted_yaml

        try:
            cfg = compose(args)
            shown = redacted_yaml(cfg) if print_key is None else config_value(cfg, print_key)
        except ConfigError as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return 2
        sys.stdout.write(shown)
        return 0
    return train(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.agl_key is not None:
        from calcx.api.tokens import key_flag_refused

        print(f"calcx train: {key_flag_refused('--agl-key', '--agl-key-file')}", file=sys.stderr)
        return 2
    return run_command("calcx train", args, compose_from_args, _train)


if __name__ == "__main__":
    raise SystemExit(main())
