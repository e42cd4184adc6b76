"""An image as a docker-archive (what `docker save` writes and `docker load` reads).

The image ID Docker shows is the sha256 of the config JSON, so the config is written with sorted
keys, no whitespace and `created` set from SOURCE_DATE_EPOCH: the same layers and settings give
the same ID. A layer the daemon already holds may be named in the manifest but left out of the
archive (the build's self-test load leaves out the base's); `docker load` finds it by the chain of
diff IDs. The archive file the build keeps carries every layer.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import IO, Any


@dataclass(frozen=True)
class ImageConfig:
    """What the image runs and how; every field goes into the config, so into the image ID."""

    diff_ids: tuple[str, ...]
    created: int
    env: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    user: str = ""
    workdir: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    history: tuple[str, ...] = ()  # one `created_by` line per layer

    def to_json(self) -> bytes:
        """The config's bytes (sorted keys, no spaces): their sha256 is the image ID."""
        if self.history and len(self.history) != len(self.diff_ids):
            raise ValueError(f"{len(self.history)} history lines for {len(self.diff_ids)} layers")
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.created))
        run: dict[str, Any] = {"Env": list(self.env), "Labels": dict(self.labels)}
        if self.entrypoint:
            run["Entrypoint"] = list(self.entrypoint)
        if self.cmd:
            run["Cmd"] = list(self.cmd)
        if self.user:
            run["User"] = self.user
        if self.workdir:
            run["WorkingDir"] = self.workdir
        doc = {
            "architecture": "amd64",
            "os": "linux",
            "created": created,
            "config": run,
            "rootfs": {"type": "layers", "diff_ids": list(self.diff_ids)},
            "history": [{"created": created, "created_by": line} for line in self.history],
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def image_id(config: bytes) -> str:
    return "sha256:" + hashlib.sha256(config).hexdigest()


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mtime: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), mtime, 0o644
    tar.addfile(info, BytesIO(data))


def write_archive(
    out: IO[bytes], config: ImageConfig, layers: Mapping[str, Path], repo_tags: Sequence[str] = ()
) -> str:
    """Write the docker-archive of `config` to `out`; return the image ID.

    `layers` maps the diff IDs this archive carries to their tar files; any other diff ID of the
    config must already be in the daemon that loads it.
    """
    unknown = set(layers) - set(config.diff_ids)
    if unknown:
        raise ValueError(f"layers {sorted(unknown)} are not in the config's diff IDs")
    config_bytes = config.to_json()
    config_hex = image_id(config_bytes).split(":", 1)[1]
    manifest = [
        {
            "Config": f"{config_hex}.json",
            "RepoTags": list(repo_tags) or None,
            "Layers": [f"{diff_id.split(':', 1)[1]}/layer.tar" for diff_id in config.diff_ids],
        }
    ]
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for diff_id in config.diff_ids:
            if diff_id in layers:
                path = layers[diff_id]
                info = tarfile.TarInfo(f"{diff_id.split(':', 1)[1]}/layer.tar")
                info.size, info.mtime, info.mode = path.stat().st_size, config.created, 0o644
                with path.open("rb") as handle:
                    tar.addfile(info, handle)
        _add_bytes(tar, f"{config_hex}.json", config_bytes, config.created)
        _add_bytes(tar, "manifest.json", json.dumps(manifest, separators=(",", ":")).encode(), config.created)
    return image_id(config_bytes)


def archive_image_id(path: Path) -> str:
    """The image ID of a docker-archive file: the sha256 its manifest gives the config's name."""
    with tarfile.open(path, mode="r:") as tar:
        member = tar.extractfile("manifest.json")
        if member is None:
            raise ValueError(f"{path}: no manifest.json, not a docker-archive")
        (entry,) = json.loads(member.read())
    return "sha256:" + entry["Config"].removesuffix(".json")
