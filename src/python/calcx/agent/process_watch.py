"""Notice the moment the calculator process exits.

The MCP stdio client starts the calculator but keeps its process object to itself, and it does
not fail a request made after the server's stdout closed (nobody is left to answer it). The
agent therefore finds the calculator among its own children (the one started in a session of
its own) and watches it through a pidfd on the event loop, so that
its exit fails the rollout at once instead of at a read timeout or the run deadline.

Linux only (``/proc``, ``pidfd_open``); elsewhere :func:`find_session_child` finds nothing
and the agent relies on the transport's own errors.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.25


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name: state, ppid, pgrp, session, ..."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    return raw.rpartition(b")")[2].decode("ascii", "replace").split()


def child_pids(parent: int | None = None) -> set[int]:
    """Live (not zombie) child processes of ``parent`` (default: this process)."""
    parent = os.getpid() if parent is None else parent
    try:
        entries = os.listdir("/proc")
    except OSError:
        return set()
    found: set[int] = set()
    for entry in entries:
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields and len(fields) > 1 and fields[1] == str(parent) and fields[0] not in ("Z", "X"):
            found.add(int(entry))
    return found


def find_session_child() -> int | None:
    """The one child of this process that leads a session of its own, else None.

    The MCP client starts the calculator with ``start_new_session=True`` and the agent starts
    no other such process; requiring exactly one keeps the watch off anything unexpected."""
    candidates = []
    for pid in child_pids():
        fields = _stat_fields(pid)
        if fields and len(fields) > 3 and fields[3] == str(pid):
            candidates.append(pid)
    return candidates[0] if len(candidates) == 1 else None


def _alive_child(pid: int) -> bool:
    fields = _stat_fields(pid)
    if not fields:
        return False
    return fields[0] not in ("Z", "X") and fields[1] == str(os.getpid())


class ProcessWatch:
    """Calls ``on_exit(description)`` once, from the event loop, when process ``pid`` exits."""

    def __init__(self, pid: int, on_exit: Callable[[str], object]) -> None:
        self.pid = pid
        self._on_exit = on_exit
        self._loop = asyncio.get_running_loop()
        self._pidfd: int | None = None
        self._poller: asyncio.Task[None] | None = None
        self._done = False
        try:
            self._pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError) as exc:  # old kernel or not Linux: poll /proc instead
            log.debug("pidfd_open(%d) failed (%r); polling /proc", pid, exc)
        if self._pidfd is not None:
            self._loop.add_reader(self._pidfd, self._fire)
            if not _alive_child(pid):  # exited (or was reaped) before the pidfd existed
                self._loop.call_soon(self._fire)
        else:
            self._poller = self._loop.create_task(self._poll())

    async def _poll(self) -> None:
        while _alive_child(self.pid):
            await asyncio.sleep(POLL_INTERVAL_S)
        self._fire()

    def _status(self) -> str:
        """How it ended, when the exit status can still be read without reaping it."""
        if self._pidfd is None or not hasattr(os, "P_PIDFD"):
            return "exited"
        try:
            info = os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except OSError:  # already reaped by the event loop's child watcher
            return "exited"
        if info is None:
            return "exited"
        if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
            return f"was killed by signal {info.si_status}"
        return f"exited with status {info.si_status}"

    def _fire(self) -> None:
        if self._done:
            return
        description = f"calculator process (pid {self.pid}) {self._status()}"
        self.close()
        self._on_exit(description)

    def close(self, kill: bool = False) -> None:
        """Stop watching (idempotent); ``on_exit`` is not called afterwards. ``kill``: send the
        process SIGKILL first, through the pidfd (never a recycled pid); without a pidfd it is
        left alone, to exit when its stdin closes."""
        self._done = True
        if kill and self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except OSError:  # it has exited already
                pass
        if self._pidfd is not None:
            try:
                self._loop.remove_reader(self._pidfd)
            except (RuntimeError, ValueError):  # the loop is already closed
                pass
            os.close(self._pidfd)
            self._pidfd = None
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None
