"""Process plumbing (calcx.procs) with real processes: a child is ready when its line appears, a
stop ends its whole process group, and `stop_all` also ends what escaped the group."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest

from calcx.procs.managed import ManagedProcess, ProcessStartError, stop_all
from calcx.procs.procutil import descendants, pid_alive

#: A parent that starts a child (in its own group, or in a new session with `escape`), prints
#: "ready <child pid>" and sleeps.
PARENT = (
    "import subprocess, sys, time\n"
    "escape = sys.argv[1] == 'escape'\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=escape)\n"
    "print('ready', child.pid, flush=True)\n"
    "time.sleep(300)\n"
)
READY = re.compile(r"^ready (\d+)$")


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _start(tmp_path: Path, mode: str) -> tuple[ManagedProcess, int]:
    part = ManagedProcess("parent", [sys.executable, "-c", PARENT, mode], tmp_path / "parent.log", dict(os.environ))
    part.start(READY, timeout_s=60)
    assert part.match is not None
    return part, int(part.match.group(1))


def test_start_waits_for_the_ready_line_and_stop_ends_the_group(tmp_path: Path) -> None:
    part, child = _start(tmp_path, "group")
    try:
        assert part.alive() and child in descendants(part.pid)
        assert (tmp_path / "parent.out").read_text().startswith("ready ")
    finally:
        part.stop(grace_s=5)
    assert not part.alive() and _gone(child)


def test_stop_all_ends_a_child_that_left_the_group(tmp_path: Path) -> None:
    part, child = _start(tmp_path, "escape")
    try:
        assert os.getpgid(child) != os.getpgid(part.pid)  # the group kill cannot reach it
    finally:
        stop_all([(part, 5.0)])
    assert not part.alive() and _gone(child)


def test_a_process_that_exits_before_its_ready_line_names_its_log(tmp_path: Path) -> None:
    part = ManagedProcess(
        "early", [sys.executable, "-c", "import sys; sys.exit(3)"], tmp_path / "early.log", dict(os.environ)
    )
    with pytest.raises(ProcessStartError, match=r"early exited with 3 before it was ready; see .*early\.log"):
        part.start(READY, timeout_s=30)
