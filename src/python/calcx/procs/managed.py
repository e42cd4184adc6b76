"""A child process in its own process group whose stdout is scanned for a ready line.

What the rehearsal, the trainer's local services, the benchmarks and the tests start their
parts with (server, stub LLM, controller): each gets a log file for stderr, a ``.out`` file for
stdout, and is ended by pid and process group.
"""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from calcx.procs.procutil import descendants, kill_survivors, parent_death_preexec, process_tree, stop_group


class ProcessStartError(RuntimeError):
    """A process did not start; the message names it and its log."""


@dataclass
class ManagedProcess:
    """A child process in its own process group, its stdout scanned for a ready line."""

    name: str
    cmd: list[str]
    log_path: Path
    env: dict[str, str]
    #: SIGKILL it when the starting thread's process dies (killed too): nothing outlives its owner
    die_with_parent: bool = False
    proc: subprocess.Popen[str] | None = None
    match: re.Match[str] | None = None
    _ready: threading.Event = field(default_factory=threading.Event)

    def start(self, ready: re.Pattern[str] | None, timeout_s: float = 120.0) -> ManagedProcess:
        """Start it and wait until a stdout line matches `ready` (the part's ready line; None: no wait)."""
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                self.cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                env=self.env,
                text=True,
                start_new_session=True,
                preexec_fn=parent_death_preexec() if self.die_with_parent else None,
            )
        finally:
            log.close()
        threading.Thread(target=self._pump, args=(ready,), name=f"{self.name}-stdout", daemon=True).start()
        if ready is None:
            return self
        deadline = time.monotonic() + timeout_s
        while not self._ready.wait(0.05):
            if self.proc.poll() is not None:
                raise ProcessStartError(
                    f"{self.name} exited with {self.proc.returncode} before it was ready; see {self.log_path}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise ProcessStartError(f"{self.name} was not ready after {timeout_s:.0f}s; see {self.log_path}")
        return self

    def _pump(self, ready: re.Pattern[str] | None) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with open(self.log_path.with_suffix(".out"), "a") as out:
            for line in self.proc.stdout:
                out.write(line)
                out.flush()
                if ready is not None and not self._ready.is_set():
                    m = ready.search(line)
                    if m:
                        self.match = m
                        self._ready.set()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = 10.0, sig: int = signal.SIGTERM) -> int | None:
        """Signal the process, wait `grace_s`, then SIGKILL its process group; returns its status."""
        if self.proc is None:
            return None
        proc = self.proc
        stop_group(proc.pid, grace_s=grace_s, sig=sig, running=lambda: proc.poll() is None)
        proc.wait(10)
        return proc.returncode


def live_pids(parts: Iterable[ManagedProcess]) -> set[int]:
    """Every live process of `parts`, their children included."""
    pids: set[int] = set()
    for part in parts:
        if part.alive():
            pids.add(part.pid)
            pids |= descendants(part.pid)
    return pids


def stop_all(steps: Sequence[tuple[ManagedProcess | None, float]]) -> None:
    """Stop each (process, grace seconds) in order, then SIGKILL whatever they had started that
    still runs: nothing started through them outlives this call."""
    tree = process_tree(p.pid for p, _ in steps if p is not None and p.alive())
    for part, grace_s in steps:
        if part is not None:
            part.stop(grace_s=grace_s)
    kill_survivors(tree)
