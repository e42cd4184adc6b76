"""The layer tar depends on what the files are, never on when, by whom or in which order they
were written: two trees with the same paths, bytes, kinds and exec bits give the same diff ID."""

from __future__ import annotations

import io
import os
import socket
import tarfile
from pathlib import Path

import pytest

from calcx.image.layer import LayerError, file_diff_id, write_layer

EPOCH = 1_700_000_000


def make_tree(root: Path, order: list[str], mtime: int, exec_mode: int = 0o755) -> Path:
    """A small image tree; `order` sets the order the files are created in."""
    files = {
        "opt/app/bin/run": b"#!/bin/sh\necho hi\n",
        "opt/app/lib/a.py": b"A = 1\n",
        "opt/app/lib/b.py": b"B = 2\n",
        "etc/passwd": b"root:x:0:0::/root:/bin/sh\n",
    }
    for name in order:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(files[name])
        os.utime(path, (mtime, mtime))
    (root / "opt/app/bin/run").chmod(exec_mode)
    (root / "opt/app/lib/a.py").chmod(0o600)
    os.symlink("/usr/bin/python3.11", root / "opt/app/bin/python")
    return root


def layer(root: Path, mtime: int = EPOCH) -> tuple[str, bytes]:
    out = io.BytesIO()
    diff_id = write_layer(root, out, mtime)
    return diff_id, out.getvalue()


ORDER = ["opt/app/bin/run", "opt/app/lib/a.py", "opt/app/lib/b.py", "etc/passwd"]


def test_same_files_written_differently_give_the_same_layer(tmp_path: Path) -> None:
    one = make_tree(tmp_path / "one", ORDER, mtime=1_000)
    two = make_tree(tmp_path / "two", list(reversed(ORDER)), mtime=2_000_000_000, exec_mode=0o700)
    (two / "opt/app/lib/a.py").chmod(0o664)  # group-writable, not executable: still 0644
    id_one, bytes_one = layer(one)
    id_two, bytes_two = layer(two)
    assert id_one == id_two
    assert bytes_one == bytes_two


def test_entries_are_sorted_with_fixed_metadata(tmp_path: Path) -> None:
    _, data = layer(make_tree(tmp_path / "t", ORDER, mtime=5))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == [
        "etc",
        "etc/passwd",
        "opt",
        "opt/app",
        "opt/app/bin",
        "opt/app/bin/python",
        "opt/app/bin/run",
        "opt/app/lib",
        "opt/app/lib/a.py",
        "opt/app/lib/b.py",
    ]
    assert {(m.uid, m.gid, m.uname, m.gname, m.mtime) for m in members} == {(0, 0, "", "", EPOCH)}
    modes = {m.name: m.mode for m in members}
    assert modes["opt/app/bin/run"] == 0o755 and modes["opt/app/lib/a.py"] == 0o644 and modes["opt"] == 0o755
    link = next(m for m in members if m.name == "opt/app/bin/python")
    assert link.issym() and link.linkname == "/usr/bin/python3.11"


def test_a_changed_byte_changes_the_diff_id(tmp_path: Path) -> None:
    one = make_tree(tmp_path / "one", ORDER, mtime=5)
    two = make_tree(tmp_path / "two", ORDER, mtime=5)
    (two / "opt/app/lib/b.py").write_bytes(b"B = 3\n")
    assert layer(one)[0] != layer(two)[0]


def test_a_changed_exec_bit_or_epoch_changes_the_diff_id(tmp_path: Path) -> None:
    one = make_tree(tmp_path / "one", ORDER, mtime=5)
    two = make_tree(tmp_path / "two", ORDER, mtime=5, exec_mode=0o644)
    assert layer(one)[0] != layer(two)[0]
    assert layer(one, EPOCH)[0] != layer(one, EPOCH + 1)[0]


def test_the_diff_id_is_the_sha256_of_the_tar(tmp_path: Path) -> None:
    diff_id, data = layer(make_tree(tmp_path / "t", ORDER, mtime=5))
    written = tmp_path / "layer.tar"
    written.write_bytes(data)
    assert file_diff_id(written) == diff_id


def test_a_socket_is_refused(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "t", ORDER, mtime=5)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(root / "opt/app/sock"))
        with pytest.raises(LayerError, match="not a regular file"):
            layer(root)
