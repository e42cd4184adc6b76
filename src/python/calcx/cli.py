"""The `calcx` command: one subcommand per part, each imported only when it is asked for.

Lazy imports keep `calcx agent` free of FastAPI and `calcx server` free of AutoGen, and let a
machine without the trainer's GPU stack still run every other part.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

# subcommand -> (module holding main(argv), one-line description)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "server": ("calcx.server.__main__", "rollout store, events, model registry and gateway (FastAPI)"),
    "controller": ("calcx.controller.__main__", "claim queued rollouts and run them (--runner local|k8s)"),
    "agent": ("calcx.agent.__main__", "run the Calc-X agent once, from the AGL_* environment"),
    "stub-llm": ("calcx.stub_llm.__main__", "scripted OpenAI-compatible model for rehearsals"),
    "rehearse": ("calcx.rehearse.__main__", "server + controller + stub LLM + a dataset, on CPU"),
    "data": (
        "calcx.data.__main__",
        "generate, import (GSM8K, Calc-X) or validate dataset files; GSM8K tool-use traces",
    ),
    "train": ("calcx.trainer.run.cli", "GRPO training with verl (needs a CUDA GPU)"),
    "warmup": (
        "calcx.trainer.warmup.sft",
        "supervised warm-up on tool-use traces with verl's SFT trainer (needs a CUDA GPU)",
    ),
    "anchor": ("calcx.anchor.cli", "the step-time anchor: verl's own ToolAgentLoop, calculator in-process"),
    "profile-step": ("calcx.trainer.workers.step_profile", "time and profile one GRPO step's GPU work, lever by lever"),
    "ledger": (
        "calcx.server.ledger_audit",
        "check a run's training ledger: each rollout trained at most once, steps whole",
    ),
    "k8s": ("calcx.k8s.build", "render and validate the Kubernetes manifests"),
    "model": ("calcx.model.__main__", "convert a GGUF file into a Hugging Face model directory"),
    "runs": ("calcx.runs.__main__", "GPU runs: results/INDEX.md from each run.yaml; a run's step tables; curves"),
}


def _usage() -> str:
    width = max(len(name) for name in SUBCOMMANDS)
    lines = ["usage: calcx <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {desc}" for name, (_, desc) in SUBCOMMANDS.items()]
    lines += ["", "Run 'calcx <command> --help' for a command's options."]
    return "\n".join(lines)


def _load(command: str) -> Callable[[list[str] | None], int]:
    module_name, _ = SUBCOMMANDS[command]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SystemExit(
            f"calcx {command}: this build lacks what the command needs ({exc}). "
            "Use the artifact built for it (see README: 'Where each part lives')."
        ) from exc
    return module.main


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if args[0] in ("-V", "--version"):
        from calcx import __version__

        print(f"calcx {__version__}")
        return 0
    command, rest = args[0], args[1:]
    if command not in SUBCOMMANDS:
        print(f"calcx: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    return int(_load(command)(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
