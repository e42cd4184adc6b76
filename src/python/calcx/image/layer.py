"""One image layer as a tar whose bytes depend only on what the files are.

Entries are sorted by path; every entry has owner 0:0 with empty owner names, the same mtime
(the build's SOURCE_DATE_EPOCH) and a mode reduced to 0755 (directories, executables) or 0644;
symlinks keep their target. Hard links become plain copies and device files are refused, so
neither the host's inode numbering nor its devices leak into the layer. The sha256 of the tar is
the layer's diff ID, which the image config names.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

DIR_MODE = 0o755
EXEC_MODE = 0o755
FILE_MODE = 0o644
LINK_MODE = 0o777


class LayerError(ValueError):
    """A file the layer cannot hold reproducibly (a device, socket or pipe)."""


class _HashingWriter(io.RawIOBase):
    """Writes through to `out` and keeps the sha256 of everything written."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self.sha256 = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self._out.write(data)
        self.sha256.update(data)
        self.size += len(data)
        return len(data)


def _walk(root: Path) -> Iterator[tuple[str, Path]]:
    """Every path under `root` (not root itself), parents before children, names sorted."""
    for name in sorted(os.listdir(root)):
        path = root / name
        yield name, path
        if path.is_dir() and not path.is_symlink():
            for sub, sub_path in _walk(path):
                yield f"{name}/{sub}", sub_path


def _entry(name: str, path: Path, mtime: int) -> tuple[tarfile.TarInfo, Path | None]:
    st = path.lstat()
    info = tarfile.TarInfo(name)
    info.mtime = mtime
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if stat.S_ISLNK(st.st_mode):
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(path)
        info.mode = LINK_MODE
        return info, None
    if stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
        info.mode = DIR_MODE
        return info, None
    if stat.S_ISREG(st.st_mode):
        info.type = tarfile.REGTYPE
        info.mode = EXEC_MODE if st.st_mode & 0o111 else FILE_MODE
        info.size = st.st_size
        return info, path
    raise LayerError(f"{path}: not a regular file, directory or symlink; a layer cannot hold it")


def write_layer(root: Path, out: BinaryIO, mtime: int) -> str:
    """Write the tree under `root` as a layer tar to `out`; return its diff ID (`sha256:...`).

    `root` stands for `/` of the image: `root/opt/agent/x` becomes `opt/agent/x`.
    """
    if mtime < 0:
        raise ValueError(f"mtime must be a non-negative epoch, got {mtime}")
    writer = _HashingWriter(out)
    with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        for name, path in _walk(root):
            info, data = _entry(name, path, mtime)
            if data is None:
                tar.addfile(info)
            else:
                with data.open("rb") as handle:
                    tar.addfile(info, handle)
    return "sha256:" + writer.sha256.hexdigest()


def file_diff_id(path: Path) -> str:
    """The diff ID of a layer tar that is already written (the base's root filesystem tarball)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()
