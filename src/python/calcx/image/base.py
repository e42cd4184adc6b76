"""The base image from a root filesystem tarball (build-base.sh's), as `docker import` would make
it but without the import's time stamp: one layer, a config dated SOURCE_DATE_EPOCH."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from calcx.image.archive import ImageConfig
from calcx.image.build import load
from calcx.image.layer import file_diff_id
from calcx.image.recipes import SYSTEM_PATH


def base_config(diff_id: str, epoch: int, labels: Mapping[str, str], history: str) -> ImageConfig:
    return ImageConfig(
        diff_ids=(diff_id,),
        created=epoch,
        env=(f"PATH={SYSTEM_PATH}", "LANG=C.UTF-8"),
        cmd=("python3",),
        labels=dict(labels),
        history=(history,),
    )


def load_base(rootfs_tar: Path, epoch: int, labels: Mapping[str, str], history: str, tags: Sequence[str]) -> str:
    """Load the tarball as a one-layer image tagged `tags`; return its image ID."""
    config = base_config(file_diff_id(rootfs_tar), epoch, labels, history)
    return load(config, {config.diff_ids[0]: rootfs_tar}, tags)
