"""Build an image from a PEX without `docker build`, so that its ID depends on its inputs only.

1. A throw-away container of the base image (no network) unpacks the PEX into its venv, byte-
   compiles it with hash-checked .pyc files (`--invalidation-mode unchecked-hash`, PYTHONHASHSEED=0:
   no source mtimes inside, sets marshalled in a fixed order) and runs the recipe's import check.
   The venv lands in a host directory; the container and the PEX leave nothing else behind.
2. That directory, the recipe's files and passwd/group (the base's, plus the image's numeric user)
   become one layer (`layer.write_layer`: sorted, owner 0:0, mtimes at SOURCE_DATE_EPOCH).
3. The config (no build time in it) and the layer go to `docker load` as a docker-archive.
4. The recipe's self-test runs in the loaded image (no network, read-only root). Only when it
   passes is the image tagged, or written as a docker-archive file (what `./pants package` of
   src/docker:<name> keeps); otherwise it is removed and the build fails.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from calcx.image.archive import ImageConfig, archive_image_id, image_id, write_archive
from calcx.image.layer import file_diff_id, write_layer
from calcx.image.recipes import DOCKER_DIR, Recipe

# the labels build-base.sh gives the base image: the sha256 of its package list (packages.lock
# without comments) and the SOURCE_DATE_EPOCH it was made at
BASE_PACKAGES_LABEL = "calcx.packages.sha256"
BASE_EPOCH_LABEL = "calcx.source-date-epoch"

DOCKER_TIMEOUT_S = 900
SELFTEST_TIMEOUT_S = 180


class BuildError(RuntimeError):
    """A build step failed; the message says which and shows its output."""


@dataclass(frozen=True)
class Built:
    image_id: str
    layer_diff_id: str
    tags: tuple[str, ...]


def docker(*args: str, timeout: float = DOCKER_TIMEOUT_S, stdin: bytes | None = None) -> str:
    """Run the docker CLI; return its stdout, or raise BuildError with its output."""
    try:
        done = subprocess.run(["docker", *args], input=stdin, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise BuildError(f"docker {args[0]} took over {timeout:.0f} s") from exc
    out = done.stdout.decode(errors="replace")
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace")
        raise BuildError(f"docker {' '.join(args[:2])} failed (exit {done.returncode}):\n{out[-4000:]}{err[-4000:]}")
    return out


def load(config: ImageConfig, layers: Mapping[str, Path], tags: Sequence[str] = ()) -> str:
    """Stream the docker-archive of `config` into `docker load`; return the image ID."""
    proc = subprocess.Popen(
        ["docker", "load", "-q"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert proc.stdin is not None
    try:
        write_archive(proc.stdin, config, layers, repo_tags=tags)  # communicate() closes stdin
    except BrokenPipeError:
        pass  # docker load stopped reading: its output below says why
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    try:
        out, _ = proc.communicate(timeout=DOCKER_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        proc.kill()
        proc.communicate()
        raise BuildError(f"docker load took over {DOCKER_TIMEOUT_S} s") from exc
    if proc.returncode != 0:
        raise BuildError(f"docker load failed (exit {proc.returncode}):\n{out.decode(errors='replace')[-4000:]}")
    return image_id(config.to_json())


def load_archive(path: Path) -> str:
    """`docker load -i` a docker-archive file (its tags come with it); return its image ID."""
    docker("load", "-q", "-i", str(path))
    return archive_image_id(path)


def base_diff_ids(base: str) -> tuple[str, ...]:
    try:
        out = docker("image", "inspect", "--format", "{{range .RootFS.Layers}}{{println .}}{{end}}", base)
    except BuildError as exc:
        raise BuildError(f"base image {base} not found: build it with src/docker/base/build-base.sh") from exc
    return tuple(line for line in out.split() if line)


def save_base_layers(base: str, base_ids: Sequence[str], into: Path) -> dict[str, Path]:
    """The base's layer tars, from `docker save`, as files under `into`: diff ID -> file. Docker
    gives back each layer's original bytes; a layer whose sha256 is not its diff ID fails."""
    saved = into / "base.tar"
    docker("save", "-o", str(saved), base)
    layers: dict[str, Path] = {}
    with tarfile.open(saved, mode="r:") as tar:
        manifest = tar.extractfile("manifest.json")
        if manifest is None:
            raise BuildError(f"docker save {base} wrote no manifest.json")
        (entry,) = json.loads(manifest.read())
        if len(entry["Layers"]) != len(base_ids):
            raise BuildError(f"docker save {base}: {len(entry['Layers'])} layers, the image has {len(base_ids)}")
        for index, (member, diff_id) in enumerate(zip(entry["Layers"], base_ids)):
            source = tar.extractfile(member)
            if source is None:
                raise BuildError(f"docker save {base}: no {member}")
            path = into / f"base-layer-{index}.tar"
            with path.open("wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
            if file_diff_id(path) != diff_id:
                raise BuildError(f"docker save {base}: layer {index} is not the bytes of its diff ID {diff_id}")
            layers[diff_id] = path
    saved.unlink()
    return layers


def base_labels(base: str) -> dict[str, str]:
    try:
        out = docker("image", "inspect", "--format", "{{json .Config.Labels}}", base)
    except BuildError as exc:
        raise BuildError(f"base image {base} not found: build it with src/docker/base/build-base.sh") from exc
    return json.loads(out) or {}


def lock_digest(lock: Path) -> str:
    """The sha256 build-base.sh labels the base with: packages.lock's lines less its comments."""
    kept = [line for line in lock.read_bytes().splitlines(keepends=True) if not line.startswith(b"#")]
    return hashlib.sha256(b"".join(kept)).hexdigest()


def check_base_lock(base: str, lock: Path) -> None:
    """Fail unless `base` was made from the package set `lock` records."""
    made_from = base_labels(base).get(BASE_PACKAGES_LABEL)
    if made_from != lock_digest(lock):
        raise BuildError(
            f"base image {base} was not made from the package set of {lock} (its label "
            f"{BASE_PACKAGES_LABEL} is {made_from}, the file's is {lock_digest(lock)}): "
            "rebuild it with src/docker/base/build-base.sh --force"
        )


def base_epoch(base: str) -> int:
    """The SOURCE_DATE_EPOCH the base was made at (its label)."""
    value = base_labels(base).get(BASE_EPOCH_LABEL, "")
    if not value.isdigit():
        raise BuildError(
            f"base image {base} has no {BASE_EPOCH_LABEL} label: rebuild it with "
            "src/docker/base/build-base.sh --force"
        )
    return int(value)


def _venv_script(recipe: Recipe, host_uid: int, host_gid: int) -> str:
    user = f"calcx:x:{recipe.uid}:{recipe.uid}::/tmp:/usr/sbin/nologin"
    return "\n".join(
        [
            "set -eu",
            "python3 -c 'import sys; assert sys.version_info[:2] == (3, 11), \"the PEX needs Python 3.11, base has \" + sys.version'",
            f"PEX_TOOLS=1 python3 /build/app.pex venv --pex-root /tmp/pex-root {recipe.venv}",
            f"{recipe.venv}/bin/python -m compileall -q -f --invalidation-mode unchecked-hash -j 0 /opt >/dev/null",
            f"PYTHONDONTWRITEBYTECODE=1 {recipe.venv}/bin/python -c '{recipe.import_check}'",
            f"{{ cat /etc/passwd; echo '{user}'; }} > /build/etc/passwd",
            f"{{ cat /etc/group; echo 'calcx:x:{recipe.uid}:'; }} > /build/etc/group",
            # the host user owns what it must clean up
            f"chown -R {host_uid}:{host_gid} /opt /build/etc",
        ]
    )


def populate(recipe: Recipe, pex: Path, base: str, root: Path, epoch: int, docker_dir: Path = DOCKER_DIR) -> None:
    """Fill `root` (the layer's `/`) with the venv, the recipe's files (under `docker_dir`),
    passwd and group."""
    (root / "opt").mkdir(parents=True)
    (root / "etc").mkdir()
    for image_path, source in recipe.files.items():
        target = root / image_path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(docker_dir / source, target)
    pex_dir = root.parent / "pex"
    pex_dir.mkdir()
    shutil.copyfile(pex, pex_dir / "app.pex")
    docker(
        "run",
        "--rm",
        "--network",
        "none",
        "--user",
        "0:0",
        "-e",
        "PYTHONHASHSEED=0",
        "-e",
        f"SOURCE_DATE_EPOCH={epoch}",
        "-v",
        f"{root / 'opt'}:/opt",
        "-v",
        f"{root / 'etc'}:/build/etc",
        "-v",
        f"{pex_dir / 'app.pex'}:/build/app.pex:ro",
        "--entrypoint",
        "/bin/sh",
        base,
        "-c",
        _venv_script(recipe, os.getuid(), os.getgid()),
    )


def image_config(recipe: Recipe, base_ids: Sequence[str], layer_id: str, epoch: int, base: str) -> ImageConfig:
    return ImageConfig(
        diff_ids=(*base_ids, layer_id),
        created=epoch,
        env=recipe.env(),
        entrypoint=recipe.entrypoint,
        user=f"{recipe.uid}:{recipe.uid}",
        workdir="/tmp",
        labels={
            "org.opencontainers.image.title": recipe.title,
            "org.opencontainers.image.description": recipe.description,
            "org.opencontainers.image.base.name": base,
        },
        history=(
            *(f"base {base}" for _ in base_ids),
            f"calcx.image {recipe.name}: venv {recipe.venv}, user {recipe.uid}",
        ),
    )


def selftest(recipe: Recipe, image: str) -> str:
    args = ["run", "--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp"]
    if recipe.selftest_entrypoint:
        args += ["--entrypoint", recipe.selftest_entrypoint]
    out = docker(*args, image, *recipe.selftest, timeout=SELFTEST_TIMEOUT_S)
    if recipe.selftest_expect not in out:
        raise BuildError(f"{recipe.name} self-test printed no {recipe.selftest_expect!r}:\n{out[-4000:]}")
    return out


def build(
    recipe: Recipe,
    pex: Path,
    base: str,
    epoch: int,
    tags: Sequence[str] = (),
    archive: Path | None = None,
    docker_dir: Path = DOCKER_DIR,
) -> Built:
    """Build, load and self-test the image of `recipe` from `pex` over `base`; then tag it `tags`
    and, given `archive`, write it there as a docker-archive named by the recipe's tags, which
    carries the base's layers too (`docker load -i` needs nothing else)."""
    if not pex.is_file():
        raise BuildError(f"PEX {pex} not found (build it with ./pants package)")
    base_ids = base_diff_ids(base)
    with tempfile.TemporaryDirectory(prefix=f"calcx-image-{recipe.name}.") as tmp:
        root = Path(tmp) / "root"
        populate(recipe, pex, base, root, epoch, docker_dir)
        layer_path = Path(tmp) / "layer.tar"
        with layer_path.open("wb") as out:
            layer_id = write_layer(root, out, epoch)
        shutil.rmtree(root)
        config = image_config(recipe, base_ids, layer_id, epoch, base)
        loaded = load(config, {layer_id: layer_path})
        try:
            selftest(recipe, loaded)
        except BuildError:
            subprocess.run(["docker", "image", "rm", loaded], capture_output=True, timeout=120)
            raise
        if archive is not None:
            layers = {**save_base_layers(base, base_ids, Path(tmp)), layer_id: layer_path}
            with archive.open("wb") as out:
                write_archive(out, config, layers, repo_tags=recipe.tags())
    for tag in tags:
        docker("tag", loaded, tag)
    return Built(image_id=loaded, layer_diff_id=layer_id, tags=tuple(tags))
