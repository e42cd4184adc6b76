"""A process that called `forbid_dumps` keeps its environment from other processes of its user:
they cannot read /proc/<pid>/environ, where the server key of a server or controller started with
CALCX_KEY lies. Checked with processes of an unprivileged user (root reads any /proc file), forked
from the test so that they need nothing from disk."""

from __future__ import annotations

import os
import time

import pytest

from calcx.procs import procutil
from calcx.procs.procutil import PR_SET_DUMPABLE, forbid_dumps

NOBODY = 65534  # the unprivileged uid both sides take
# libc is loaded before any fork: a child of the unprivileged user cannot read the interpreter's files
LIBC = procutil._load_libc()


def _as_nobody() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def _holder(forbid: bool, ready_w: int) -> int:
    """A child of the unprivileged user that holds a secret in its environment (as a server does)."""
    pid = os.fork()
    if pid == 0:
        try:
            _as_nobody()
            # a change of uid leaves a process non-dumpable; one started by that user is dumpable
            assert LIBC.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) == 0
            os.environ["CALCX_KEY"] = "a-secret"
            if forbid:
                assert forbid_dumps()
            os.write(ready_w, b"x")
            time.sleep(30)
        finally:
            os._exit(0)
    return pid


def _can_read_environ(pid: int) -> bool:
    """Whether a process of the same unprivileged user can read the holder's environment."""
    r, w = os.pipe()
    reader = os.fork()
    if reader == 0:
        os.close(r)
        try:
            _as_nobody()
            try:
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    fh.read()
                os.write(w, b"1")
            except PermissionError:
                os.write(w, b"0")
        finally:
            os._exit(0)
    os.close(w)
    answer = os.read(r, 1)
    os.waitpid(reader, 0)
    os.close(r)
    return answer == b"1"


@pytest.mark.skipif(os.geteuid() != 0, reason="takes an unprivileged uid for both sides: needs to start as root")
def test_a_process_that_forbids_dumps_keeps_its_environment_from_its_own_user() -> None:
    holders = []
    try:
        for forbid in (False, True):
            r, w = os.pipe()
            holders.append(_holder(forbid, w))
            os.close(w)  # the holder's copy is the only one left: a holder that fails ends the read
            assert os.read(r, 1) == b"x", "the holder did not get ready"
            os.close(r)
        plain, guarded = holders
        assert _can_read_environ(plain)  # the same user reads an ordinary process's environment
        assert not _can_read_environ(guarded)
    finally:
        for pid in holders:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
