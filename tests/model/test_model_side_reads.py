"""The direct route's side reads (calcx.model.gguf.SideRead): real forked processes, started all or
none. A start that fails for want of a file descriptor (the soft RLIMIT_NOFILE lowered while the
reads start) must leave no read process running and no pipe end open."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable, Iterator
from multiprocessing import active_children
from pathlib import Path
from typing import Any

import pytest

from calcx.model.gguf import SideRead, start_side_reads


def _name(gguf: Path) -> str:
    return gguf.name


def _size(gguf: Path) -> int:
    return gguf.stat().st_size


def _sleep(gguf: Path) -> None:
    time.sleep(60)


def _open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def _limit_after(free: int) -> int:
    """The soft RLIMIT_NOFILE under which exactly ``free`` more descriptors can be opened."""
    opened, limit = _open_fds(), 0
    while free > 0 or limit in opened:
        free -= limit not in opened
        limit += 1
    return limit


@pytest.fixture
def nofile() -> Iterator[Callable[[int | None], None]]:
    """Sets the soft descriptor limit (None: the one the test began with, which also comes back at
    its end)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    def set_limit(limit: int | None) -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft if limit is None else limit, hard))

    yield set_limit
    set_limit(None)


@pytest.fixture
def children() -> Iterator[Callable[[], list[Any]]]:
    """The read processes this test started that are still running; any left are ended at its end."""
    before = set(active_children())

    def running() -> list[Any]:
        return [p for p in active_children() if p not in before]

    yield running
    for process in running():
        process.kill()
        process.join()


def test_side_reads_bring_back_their_results(tmp_path: Path, children: Callable[[], list[Any]]) -> None:
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF" + bytes(12))
    reads = start_side_reads((_name, _size), gguf)
    assert [read.get() for read in reads] == ["tiny.gguf", 16]
    for read in reads:
        read.stop()
    assert children() == []


def test_a_read_that_cannot_start_stops_those_started(
    tmp_path: Path, nofile: Callable[[int | None], None], children: Callable[[], list[Any]]
) -> None:
    def reads() -> Iterator[Callable[[Path], Any]]:
        yield _sleep
        assert len(children()) == 1  # the first read is running
        nofile(0)  # the second finds no descriptor for its pipe
        yield _sleep

    fds = _open_fds()
    with pytest.raises(OSError):
        start_side_reads(reads(), tmp_path / "any.gguf")
    nofile(None)
    assert children() == [], "a read started before the failed one is still running"
    assert _open_fds() == fds


def test_a_read_whose_process_cannot_start_closes_its_pipe(
    tmp_path: Path, nofile: Callable[[int | None], None], children: Callable[[], list[Any]]
) -> None:
    fds = _open_fds()
    nofile(_limit_after(2))  # room for the result pipe, none for the process's own
    with pytest.raises(OSError) as failed:
        SideRead(_sleep, tmp_path / "any.gguf")
    nofile(None)
    assert children() == []
    # closed at once, not when the exception's frames are collected
    assert _open_fds() == fds, f"the result pipe of a read that never started is left open ({failed.value})"
