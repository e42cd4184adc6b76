"""Finding what ran: agents and calculators under a controller (from its log, /proc and the
calculator's pipes), and the rewards the agents said they posted (from their own output)."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterable
from pathlib import Path

from calcx.procs.procutil import descendants, process_name

STARTED_RE = re.compile(r"started (\S+)/(\S+) pid (\d+)")


def started_lines(log_paths: Iterable[Path]) -> list[tuple[str, str, int, str]]:
    """(rid, aid, pid, log name) for every agent start the controllers logged."""
    out = []
    for path in log_paths:
        try:
            text = Path(path).read_text(errors="replace")
        except OSError:
            continue
        for m in STARTED_RE.finditer(text):
            out.append((m.group(1), m.group(2), int(m.group(3)), Path(path).name))
    return out


def _fd_target(pid: int, fd: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None


def _fd_targets(pid: int) -> set[str]:
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return set()
    return {t for t in (_fd_target(pid, int(n)) for n in names) if t and t.startswith("pipe:")}


def calculator_of_agent(controller_pid: int, agent_pid: int) -> int | None:
    """The calculator process serving ``agent_pid``: a ``calcx-calc`` below the controller whose
    stdin is a pipe the agent holds the other end of (the MCP stdio transport)."""
    agent_pipes = _fd_targets(agent_pid)
    if not agent_pipes:
        return None
    for pid in descendants(controller_pid):
        if process_name(pid) == "calcx-calc" and _fd_target(pid, 0) in agent_pipes:
            return pid
    return None


def kill_if_below(root_pid: int, pid: int, comm: str, sig: int = signal.SIGKILL) -> bool:
    """Signal ``pid`` only if it is still a descendant of ``root_pid`` with the expected name."""
    if pid in descendants(root_pid) and process_name(pid) == comm:
        try:
            os.kill(pid, sig)
            return True
        except ProcessLookupError:
            return False
    return False


AGENT_FINISHED_RE = re.compile(r"calcx-agent: finished reward=(\S+)")


def agent_rewards(log_dirs: Iterable[Path]) -> dict[tuple[str, str], float]:
    """(rid, aid) -> the reward each agent said it posted (from its own output)."""
    out: dict[tuple[str, str], float] = {}
    for d in log_dirs:
        if not Path(d).is_dir():
            continue
        for path in Path(d).glob("*.log"):
            if path.name == "zygote.log":
                continue
            rid, _, aid = path.stem.rpartition(".")
            m = None
            for m in AGENT_FINISHED_RE.finditer(path.read_text(errors="replace")):  # noqa: B007 (the last match)
                pass
            if m is not None:
                out[(rid, aid)] = float(m.group(1))
    return out
