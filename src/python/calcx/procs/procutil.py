"""Small process helpers: parent-death signals, process-group kills and stops, /proc process trees."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
_libc = None


def forbid_dumps() -> bool:
    """Make this process non-dumpable (PR_SET_DUMPABLE 0): other processes of the same user can no
    longer read its /proc/<pid>/environ, mem or maps, nor attach a debugger to it, and it writes no
    core file. The server, the controller and the trainer call it at start, so that
    an agent (a process of the same user, running code calcx did not write) cannot read the server
    key out of them. An exec'd child starts dumpable again. False where Linux's prctl is missing."""
    libc = _load_libc()
    if libc is None:
        return False
    try:
        return bool(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def set_parent_death_signal(sig: int = signal.SIGKILL, expected_parent: int | None = None) -> bool:
    """Ask Linux to send `sig` to this process when its parent dies (PR_SET_PDEATHSIG).

    When `expected_parent` is given and the parent is already gone, exit at once: the signal
    would never come. Returns False where the platform has no such facility.
    """
    libc = _load_libc()
    if libc is None:
        return False
    try:
        ok = libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)
    return ok


def _load_libc() -> Any:
    """libc through ctypes (None off Linux), loaded once."""
    global _libc
    if _libc is None and sys.platform.startswith("linux"):
        try:
            import ctypes

            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            return None
    return _libc


def parent_death_preexec(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A Popen `preexec_fn`: the child gets `sig` when this process's calling thread dies, so a
    parent killed with SIGKILL leaves no child behind. libc is loaded here, in the parent: between
    fork and exec the child only makes the prctl call."""
    _load_libc()
    parent = os.getpid()

    def in_child() -> None:
        set_parent_death_signal(sig, expected_parent=parent)

    return in_child


PR_SET_NAME = 15


def set_process_name(name: str) -> None:
    """Name this process in ``ps -o comm``/top and /proc/PID/comm (Linux; 15 bytes)."""
    global _libc
    if not sys.platform.startswith("linux"):
        return
    try:
        if _libc is None:
            import ctypes

            _libc = ctypes.CDLL(None, use_errno=True)
        _libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


def process_name(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return None


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> bool:
    """Signal a whole process group; falls back to the single pid. True when something got it."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        try:
            os.kill(pgid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    except PermissionError:
        return False


def stop_group(
    pid: int, *, grace_s: float = 10.0, sig: int = signal.SIGTERM, running: Callable[[], bool] | None = None
) -> None:
    """Stop a process that leads its own group: send it `sig`, give it `grace_s` to exit, then
    SIGKILL its whole group. Whatever is left in the group is killed either way, so no helper
    it started in its group outlives it.

    `running` tells whether it still runs (a ``Popen.poll`` wrapper reaps it as a side effect);
    without it, /proc is asked (a zombie counts as gone).
    """
    alive = running or (lambda: pid_alive(pid))
    if alive():
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + grace_s
        delay = 0.0005
        while alive() and time.monotonic() < deadline:
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
    kill_group(pid)


def process_tree(pids: Iterable[int]) -> dict[int, int | None]:
    """Every live process below `pids`, with its start time: what `kill_survivors` may end later."""
    tree: dict[int, int | None] = {}
    for pid in pids:
        tree.update({child: process_start_time(child) for child in descendants(pid)})
    return tree


def survivors(tree: dict[int, int | None]) -> list[int]:
    """The processes of `tree` still alive as the same process (a reused pid has another start time)."""
    return [pid for pid, started in tree.items() if started is not None and process_start_time(pid) == started]


def kill_survivors(tree: dict[int, int | None]) -> list[int]:
    """SIGKILL whatever of `tree` is still alive; returns their pids."""
    killed = []
    for pid in survivors(tree):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass
    return killed


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
    state = stat.rsplit(b")", 1)[1].split()[0]
    return state not in (b"Z", b"X")


def process_start_time(pid: int) -> int | None:
    """Start time of a live process in clock ticks (tells a pid from a reused one)."""
    if not pid_alive(pid):
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def cpu_seconds(pid: int, children: bool = True) -> float:
    """CPU time of a live process (user+system), plus that of its reaped children."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def pss_bytes(pid: int) -> int:
    """Proportional set size (shared pages split between sharers); 0 when unknown."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _parents() -> dict[int, int]:
    out: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat.rsplit(b")", 1)[1].split()
        out[int(name)] = int(fields[1])
    return out


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` in the process tree (Linux /proc)."""
    parents = _parents()
    children: dict[int, list[int]] = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    found: set[int] = set()
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return {p for p in found if pid_alive(p)}


def rss_bytes(pid: int) -> int:
    """Resident set size of one process (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
