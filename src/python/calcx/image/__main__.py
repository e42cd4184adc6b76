"""`python -m calcx.image`: build the agent or controller image from its PEX, or load the base
image from its root filesystem tarball; prints the image ID.

  python -m calcx.image agent --pex dist/src.python.calcx.agent/agent.pex --tag calcx/agent:latest
  python -m calcx.image controller --pex dist/src.python.calcx/calcx.pex --tag calcx/controller:latest
  python -m calcx.image load dist/src.docker/agent-image.tar    # what ./pants package src/docker:agent wrote
  python -m calcx.image base --rootfs-tar rootfs.tar --tag calcx/base:bookworm-py311 --label k=v

Timestamps come from --epoch, else SOURCE_DATE_EPOCH, else the commit time of the checkout's HEAD;
--epoch-from-base takes the base image's own (what the Pants targets src/docker:agent and
:controller do, with --archive, --base-lock and --no-tag: the image as a docker-archive file).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from calcx.image.base import load_base
from calcx.image.build import BuildError, base_epoch, build, check_base_lock, load_archive
from calcx.image.recipes import DEFAULT_BASE, DOCKER_DIR, RECIPES


def source_date_epoch(given: int | None) -> int:
    """--epoch, else $SOURCE_DATE_EPOCH, else `git log -1 --format=%ct` (the commit's time)."""
    if given is not None:
        return given
    env = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if env:
        if not env.isdigit():
            raise BuildError(f"SOURCE_DATE_EPOCH must be whole seconds since 1970, got {env!r}")
        return int(env)
    try:
        done = subprocess.run(["git", "log", "-1", "--format=%ct"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError("no --epoch or SOURCE_DATE_EPOCH, and git could not say the commit's time") from exc
    if done.returncode != 0 or not done.stdout.strip().isdigit():
        raise BuildError("no --epoch or SOURCE_DATE_EPOCH, and this is not a git checkout with a commit")
    return int(done.stdout.strip())


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"a label is KEY=VALUE, got {text!r}")
    return key, value


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="python -m calcx.image", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = top.add_subparsers(dest="what", required=True)
    for name in RECIPES:
        image = sub.add_parser(name, help=f"the {name} image from its PEX")
        image.add_argument("--pex", type=Path, required=True)
        image.add_argument("--base", default=os.environ.get("BASE_IMAGE") or DEFAULT_BASE)
        image.add_argument(
            "--tag", action="append", default=[], help=f"default calcx/{name}:<version> and calcx/{name}:latest"
        )
        image.add_argument("--no-tag", action="store_true", help="leave the image untagged (a check build)")
        image.add_argument("--epoch", type=int)
        image.add_argument(
            "--epoch-from-base",
            action="store_true",
            help="date the image at the base image's SOURCE_DATE_EPOCH (its label)",
        )
        image.add_argument("--archive", type=Path, help="also write the image here as a docker-archive")
        image.add_argument("--base-lock", type=Path, help="fail unless the base was made from this packages.lock")
        image.add_argument(
            "--docker-dir", type=Path, default=DOCKER_DIR, help="where the recipes' files lie (src/docker)"
        )
    loader = sub.add_parser("load", help="docker load a docker-archive file, tagged as it names")
    loader.add_argument("archive", type=Path)
    base = sub.add_parser("base", help="the base image from a root filesystem tarball")
    base.add_argument("--rootfs-tar", type=Path, required=True)
    base.add_argument("--tag", action="append", default=[])
    base.add_argument("--label", type=_label, action="append", default=[])
    base.add_argument("--history", default="calcx base root filesystem")
    base.add_argument("--epoch", type=int)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.what == "load":
            image_id = load_archive(args.archive)
        elif args.what == "base":
            epoch = source_date_epoch(args.epoch)
            image_id = load_base(args.rootfs_tar, epoch, dict(args.label), args.history, args.tag)
        else:
            if args.base_lock is not None:
                check_base_lock(args.base, args.base_lock)
            epoch = base_epoch(args.base) if args.epoch_from_base else source_date_epoch(args.epoch)
            recipe = RECIPES[args.what]
            tags = () if args.no_tag else (args.tag or recipe.tags())
            image_id = build(recipe, args.pex, args.base, epoch, tags, args.archive, args.docker_dir).image_id
    except BuildError as exc:
        print(f"calcx.image: {exc}", file=sys.stderr)
        return 1
    print(image_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
