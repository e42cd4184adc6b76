"""src/gpu/stage_carry.sh: the carry to a machine with no network, one folder a transfer. Every
piece beside the repository's own tree must fit one transfer; the model's chunks are cut again to
the piece size whatever size they were fetched in, and the pieces join back into the files."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

STAGE = Path(__file__).resolve().parents[2] / "src" / "gpu" / "stage_carry.sh"
MIB = 1024 * 1024


def _checkout(tmp: Path, tree_bytes: int) -> Path:
    """A git checkout of ``tree_bytes`` in all: the script and one tracked file."""
    root = tmp / "repo"
    (root / "src" / "gpu").mkdir(parents=True)
    shutil.copy(STAGE, root / "src" / "gpu" / "stage_carry.sh")
    (root / "records.bin").write_bytes(os.urandom(tree_bytes - STAGE.stat().st_size))
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "-A"], check=True)
    return root


def _inputs(tmp: Path) -> tuple[Path, Path, Path, bytes]:
    pex = tmp / "calcx-gpu.pex"
    pex.write_bytes(os.urandom(3 * MIB + 5))
    gguf = os.urandom(5 * MIB + 7)
    chunks = tmp / "chunks"
    chunks.mkdir()
    for n, start in enumerate(range(0, len(gguf), 2 * MIB + 1)):  # fetched in pieces of another size
        (chunks / f"model.gguf.{n:02d}").write_bytes(gguf[start : start + 2 * MIB + 1])
    sums = subprocess.run("sha256sum model.gguf.*", shell=True, cwd=chunks, check=True, capture_output=True)
    (chunks / "SHA256SUMS").write_bytes(sums.stdout)
    data = tmp / "data"
    data.mkdir()
    for name in (
        "train.parquet",
        "test.parquet",
        "test-hard.parquet",
        "test-harder.parquet",
        "train-harder.parquet",
        "distilled-traces.parquet",
        "test_mini.parquet",
    ):  # every test-*/train-* split and the distilled warm-up's traces travel; a file of another name does not
        (data / name).write_bytes(name.encode())
    return pex, chunks, data, gguf


def _stage(root: Path, *args: str, limit_mib: int = 64) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CARRY_LIMIT_MIB": str(limit_mib)}
    return subprocess.run(
        ["bash", str(root / "src" / "gpu" / "stage_carry.sh"), *args], env=env, capture_output=True, text=True
    )


def test_pieces_of_the_size_asked_join_back_into_the_pex_and_the_model(tmp_path: Path) -> None:
    root = _checkout(tmp_path, 1 * MIB)
    pex, chunks, data, gguf = _inputs(tmp_path)
    out = tmp_path / "carry"
    done = _stage(root, str(pex), str(chunks), str(data), str(out), "1", limit_mib=4)
    assert done.returncode == 0, done.stderr
    folders = sorted(p.name for p in out.iterdir())
    assert folders == [f"{n:02d}" for n in range(len(folders))] and len(folders) == 1 + 4 + 6
    pieces = sorted(out.glob("[0-9][0-9]/*.[0-9][0-9]"), key=lambda p: p.parent.name)
    assert all(p.stat().st_size <= MIB for p in pieces) and all(len(list(p.parent.iterdir())) == 1 for p in pieces)
    joined_pex = b"".join(p.read_bytes() for p in pieces if p.name.startswith("calcx-gpu.pex."))
    joined_model = b"".join(p.read_bytes() for p in pieces if p.name.startswith("model.gguf."))
    assert joined_pex == pex.read_bytes() and joined_model == gguf
    head = out / "00"
    assert (head / "calcx-gpu.pex.sha256").read_text().strip() == hashlib.sha256(pex.read_bytes()).hexdigest()
    assert sorted(p.name for p in (head / "gsm8k").iterdir()) == [
        "distilled-traces.parquet",
        "test-hard.parquet",
        "test-harder.parquet",
        "test.parquet",
        "train-harder.parquet",
        "train.parquet",
    ]
    for sums in ("SHA256SUMS.pex", "SHA256SUMS.model"):  # what the machine checks before it joins
        for line in (head / sums).read_text().splitlines():
            digest, name = line.split()
            piece = next(p for p in pieces if p.name == name)
            assert hashlib.sha256(piece.read_bytes()).hexdigest() == digest


@pytest.mark.parametrize("piece_mib, tree_mib, limit_mib", [("3", 1, 4), ("2", 2, 4)])
def test_a_piece_that_would_not_fit_beside_the_tree_is_refused_before_anything_is_written(
    tmp_path: Path, piece_mib: str, tree_mib: int, limit_mib: int
) -> None:
    root = _checkout(tmp_path, tree_mib * MIB)
    pex, chunks, data, _ = _inputs(tmp_path)
    out = tmp_path / "carry"
    refused = _stage(root, str(pex), str(chunks), str(data), str(out), piece_mib, limit_mib=limit_mib)
    assert refused.returncode == 2 and not out.exists()
    assert (
        f"a {piece_mib} MiB piece beside the repository's {tree_mib} MiB would pass a {limit_mib} MiB" in refused.stderr
    )
    assert f"use PIECE_MB <= {limit_mib - tree_mib - 1}" in refused.stderr


def test_chunks_that_do_not_match_their_checksums_are_refused(tmp_path: Path) -> None:
    root = _checkout(tmp_path, 64 * 1024)
    pex, chunks, data, _ = _inputs(tmp_path)
    (chunks / "model.gguf.01").write_bytes(b"damaged")
    refused = _stage(root, str(pex), str(chunks), str(data), str(tmp_path / "carry"), "1", limit_mib=4)
    assert refused.returncode != 0 and not (tmp_path / "carry").exists()
