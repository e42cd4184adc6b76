"""The image config carries no build time: its bytes, so the image ID, follow from its fields."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from calcx.image.archive import ImageConfig, image_id, write_archive

BASE = "sha256:" + "b" * 64
TOP = "sha256:" + "c" * 64


def config(**changes: object) -> ImageConfig:
    fields: dict[str, object] = dict(
        diff_ids=(BASE, TOP),
        created=1_704_067_200,
        env=("LANG=C.UTF-8",),
        entrypoint=("/opt/agent/bin/python", "-m", "calcx.agent"),
        user="10001:10001",
        workdir="/tmp",
        labels={"b": "2", "a": "1"},
        history=("base", "top"),
    )
    fields.update(changes)
    return ImageConfig(**fields)  # type: ignore[arg-type]


def test_the_same_fields_give_the_same_bytes_and_id() -> None:
    assert config().to_json() == config(labels={"a": "1", "b": "2"}).to_json()
    doc = json.loads(config().to_json())
    assert doc["created"] == "2024-01-01T00:00:00Z"
    assert doc["rootfs"] == {"type": "layers", "diff_ids": [BASE, TOP]}
    assert doc["config"]["User"] == "10001:10001"


@pytest.mark.parametrize(
    "change",
    [
        {"created": 1_704_067_201},
        {"user": "10002:10002"},
        {"diff_ids": (BASE, "sha256:" + "d" * 64)},
        {"env": ("LANG=C",)},
    ],
)
def test_any_changed_field_changes_the_id(change: dict[str, object]) -> None:
    assert image_id(config(**change).to_json()) != image_id(config().to_json())


def test_history_must_match_the_layers() -> None:
    with pytest.raises(ValueError, match="2 history lines for 1 layers"):
        config(diff_ids=(TOP,)).to_json()


def test_archive_names_every_layer_and_carries_only_the_given_ones(tmp_path: Path) -> None:
    top = tmp_path / "top.tar"
    top.write_bytes(b"layer bytes")
    out = io.BytesIO()
    got = write_archive(out, config(), {TOP: top}, repo_tags=["calcx/agent:latest"])
    assert got == image_id(config().to_json())
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tar:
        names = tar.getnames()
        manifest = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
        assert tar.extractfile(f"{got[7:]}.json").read() == config().to_json()  # type: ignore[union-attr]
    assert names == [f"{'c' * 64}/layer.tar", f"{got[7:]}.json", "manifest.json"]
    assert manifest == [
        {
            "Config": f"{got[7:]}.json",
            "RepoTags": ["calcx/agent:latest"],
            "Layers": [f"{'b' * 64}/layer.tar", f"{'c' * 64}/layer.tar"],
        }
    ]
    again = io.BytesIO()
    write_archive(again, config(), {TOP: top}, repo_tags=["calcx/agent:latest"])
    assert again.getvalue() == out.getvalue()


def test_a_layer_outside_the_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not in the config"):
        write_archive(io.BytesIO(), config(), {"sha256:" + "e" * 64: tmp_path / "x.tar"})
