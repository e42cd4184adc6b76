"""Every composed config the trainer's commands can print, written to one directory, for a diff
across a change that must leave them as they were (a move of modules, a new default):

    ./pants run benchmarks/composed_configs.py -- OUT_DIR

One YAML file per case (secrets masked, as `--print-config` prints them): `calcx train` for
each run profile of calcx.yaml (and none) x GPU memory 0, 80 and 141 GiB x sync and async;
`calcx anchor train` for each run profile x the same memories; `calcx warmup` for the same
memories; and the commands' own `--print-config` (train, `--eval-only`, train on 2 and 8 GPUs and
on 2 nodes, anchor, warm-up) as a machine without a GPU prints it. Paths of this checkout and of verl are written as <calcx> and
<verl>, so that two checkouts compare.
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import yaml

from calcx.anchor.cli import main as anchor_main
from calcx.anchor.config import compose_anchor
from calcx.trainer.config.compose import CALCX_OVERRIDES, ComposeRequest, compose, redacted_yaml, verl_config_dir
from calcx.trainer.run.cli import main as train_main
from calcx.trainer.warmup.sft import WarmupRequest, compose_warmup
from calcx.trainer.warmup.sft import main as warmup_main

MEMORIES_GIB = (0.0, 80.0, 141.0)
FILES = ["--model", "models/m", "--train-file", "train.parquet", "--val-file", "val.parquet"]
#: `calcx train --print-config` on more GPUs than one (docs/scale-out.md)
SCALES = {
    "gpus2": ["--gpus", "2"],
    "gpus8": ["--gpus", "8"],
    "2nodes": ["--gpus", "8", "--nnodes", "2", "--ray-address", "head:6379", "--services-host", "10.0.0.1"],
}


def run_profiles() -> list[str | None]:
    names = yaml.safe_load(CALCX_OVERRIDES.read_text(encoding="utf-8")).get("run_profiles") or {}
    return [None, *sorted(names)]


def printed(main, argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    if code != 0:
        raise SystemExit(f"{argv}: exit {code}")
    return out.getvalue()


def cases() -> dict[str, str]:
    found: dict[str, str] = {}
    for profile in run_profiles():
        name = profile or "no-profile"
        for memory in MEMORIES_GIB:
            for async_mode in (False, True):
                request = ComposeRequest(
                    model="models/m",
                    train_files="train.parquet",
                    val_files="val.parquet",
                    async_mode=async_mode,
                    gpu_memory_gib=memory,
                    run_profile=profile,
                )
                found[f"train-{name}-{memory:g}gib-{'async' if async_mode else 'sync'}"] = redacted_yaml(
                    compose(request)
                )
            request = ComposeRequest(
                model="models/m",
                train_files="train.parquet",
                val_files="val.parquet",
                gpu_memory_gib=memory,
                run_profile=profile,
            )
            found[f"anchor-{name}-{memory:g}gib"] = redacted_yaml(compose_anchor(request))
    for memory in MEMORIES_GIB:
        warmup = WarmupRequest(
            model="models/m", traces="t.parquet", val_traces="v.parquet", gpu_memory_gib=memory, gpu_profile="auto"
        )
        found[f"warmup-{memory:g}gib"] = redacted_yaml(compose_warmup(warmup))
    found["cli-train"] = printed(train_main, [*FILES, "--print-config"])
    found["cli-train-async"] = printed(train_main, [*FILES, "--async", "--print-config"])
    found["cli-eval-only"] = printed(
        train_main, [*FILES, "--eval-only", "--model-endpoint", "http://127.0.0.1:1/v1", "--print-config"]
    )
    for name, scale in SCALES.items():
        found[f"cli-train-{name}"] = printed(train_main, [*FILES, *scale, "--print-config"])
    found["cli-anchor"] = printed(anchor_main, ["train", *FILES, "--print-config"])
    found["cli-warmup"] = printed(warmup_main, ["--model", "models/m", "--traces", "t.parquet", "--print-config"])
    return found


def main(argv: list[str]) -> int:
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    calcx_root = str(Path(CALCX_OVERRIDES).resolve().parents[2])
    verl_root = str(verl_config_dir().parents[1])
    found = cases()
    for name, text in found.items():
        text = text.replace(calcx_root, "<calcx>").replace(verl_root, "<verl>")
        (out / f"{name}.yaml").write_text(text, encoding="utf-8")
    print(f"{len(found)} composed configs in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
