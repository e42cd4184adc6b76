"""What the worker does around fork(): fork a child (now, or ahead of demand as a spare), and
in the child leave the worker's world behind and run one agent or calculator."""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from calcx.contract.env import CALCX_ZYGOTE_PROFILE_DIR
from calcx.contract.failures import FailureReason, failure_line
from calcx.procs.procutil import set_parent_death_signal, set_process_name
from calcx.worker.protocol import MAX_FDS, MAX_LEARN


class Forking:
    """The forking half of :class:`calcx.worker.serve.ZygoteServer` (which sets these attributes)."""

    pid: int
    sock_path: str
    agent_entry: Callable[[dict[str, str]], int] | None
    calc_module: str | None
    control_fd: int | None
    base_env: dict[str, str]
    conns: dict[int, Any]
    spares: dict[int, socket.socket]
    spare_target: int
    child_nice: int
    learn_rounds: int
    stats: dict[str, float]
    sel: selectors.BaseSelector
    listener: socket.socket
    wake_r: int
    wake_w: int

    def _fork(self, keep: list[int] | None = None) -> int | None:
        """fork(); in the child, leave the zygote's world behind (returns 0 there)."""
        sys.stdout.flush()
        sys.stderr.flush()
        t0 = time.perf_counter()
        try:
            pid = os.fork()
        except OSError as exc:
            sys.stderr.write(f"calcx-zygote: fork failed: {exc}\n")
            return None
        if pid == 0:
            self._child_common(keep or [])
            return 0
        self.stats["fork_s"] += time.perf_counter() - t0
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass  # the child already did it; either way it leads its own group
        return pid

    def _fork_spare(self) -> None:
        """Fork a child ahead of demand; it waits for a job, so a request costs no fork."""
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = self._fork(keep=[child_end.fileno()])
        if pid is None:
            parent_end.close()
            child_end.close()
            self.spare_target = 0  # forking fails: stop trying ahead of demand
            return
        if pid == 0:
            parent_end.close()
            set_process_name("calcx-spare")
            self._spare_wait(child_end)
        child_end.close()
        self.spares[pid] = parent_end

    def _spare_wait(self, sock: socket.socket) -> None:
        """In a spare child: block until the zygote hands over a job, then run it."""
        code = 0
        try:
            buf, fds = b"", []
            while b"\n" not in buf:
                data, got, _flags, _addr = socket.recv_fds(sock, 1 << 16, MAX_FDS)
                fds.extend(got)
                if not data:
                    os._exit(0)  # the zygote is closing: nothing to run
                buf += data
            sock.close()
            job = json.loads(buf.partition(b"\n")[0])
            self._child_run(job["kind"], job.get("env") or {}, fds)
        except BaseException:
            traceback.print_exc()
            code = 70
        _flush_and_exit(code)

    def _child_common(self, keep: list[int]) -> None:
        """In a fresh child: leave the zygote's world behind before running anything."""
        try:
            os.setpgid(0, 0)
        except OSError:
            pass
        set_parent_death_signal(signal.SIGKILL, expected_parent=self.pid)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        # as a fresh interpreter starts: a write to a dead reader (a killed calculator's pipe) fails
        # with EPIPE, which the agent handles (calculator_failed), instead of killing it
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if self.child_nice:
            try:
                os.nice(self.child_nice)
            except OSError:
                pass
        for conn in list(self.conns.values()):
            for fd in conn.fds:  # another request's pipes must not stay open in this child
                if fd not in keep:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            try:
                conn.sock.close()
            except OSError:
                pass
        for sock in self.spares.values():
            sock.close()
        self.spares = {}
        try:
            self.sel.close()
        except Exception:
            pass
        self.listener.close()
        for fd in (self.wake_r, self.wake_w, self.control_fd):
            if fd is not None and fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _child_run(self, kind: str, env: dict[str, str | None], fds: list[int]) -> None:
        """In a child: run one agent (one fd: stdout+stderr) or calculator (fds 0, 1, 2)."""
        code = 70
        set_process_name("calcx-agent" if kind == "agent" else "calcx-calc")
        try:
            if kind == "agent" and len(fds) == 1:
                code = self._agent_child(env, fds[0])
            elif kind == "calc" and len(fds) == 3:
                code = self._calc_child(fds)
            else:
                sys.stderr.write(f"calcx-zygote: bad job {kind!r} with {len(fds)} fds\n")
        except BaseException:
            traceback.print_exc()
            sys.stderr.write(failure_line(FailureReason.CRASH, "the worker could not start the rollout") + "\n")
        finally:
            _flush_and_exit(code)

    def _agent_child(self, env: dict[str, str | None], out_fd: int) -> int:
        null = os.open(os.devnull, os.O_RDONLY)
        _install_fds([null, out_fd, out_fd])
        full_env = dict(self.base_env)  # the allowlisted part of the worker's environment (serve.py)
        for name, value in env.items():
            if value is None:
                full_env.pop(name, None)
            else:
                full_env[name] = value
        os.environ.clear()
        os.environ.update(full_env)
        sys.argv = ["calcx-agent"]
        before = set(sys.modules) if self.learn_rounds > 0 else None
        profile_dir = self.base_env.get(CALCX_ZYGOTE_PROFILE_DIR)
        if profile_dir:
            code = _profiled(profile_dir, lambda: _run_entry(self.agent_entry, full_env))  # type: ignore[arg-type]
        else:
            code = _run_entry(self.agent_entry, full_env)  # type: ignore[arg-type]
        if before is not None:
            _report_new_modules(self.sock_path, set(sys.modules) - before)
        return code

    def _calc_child(self, fds: list[int]) -> int:
        _install_fds(fds)
        os.environ.clear()
        os.environ.update(self.base_env)
        return _run_module(self.calc_module)  # type: ignore[arg-type]


def _install_fds(sources: list[int]) -> None:
    """Make fd 0, 1, 2 copies of `sources` and close the originals, whatever their numbers
    (a received fd may itself be 0, 1 or 2)."""
    import fcntl

    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in sources]
    for fd in set(sources):
        if fd not in (0, 1, 2):
            os.close(fd)
    for target, fd in enumerate(high):
        os.dup2(fd, target)
    for fd in set(high):
        os.close(fd)


def _profiled(directory: str, fn: Callable[[], int]) -> int:
    """Run `fn` under cProfile and dump DIR/agent-<pid>.prof (tuning aid, see docs/controller.md)."""
    import cProfile

    prof = cProfile.Profile(time.process_time)  # CPU, not wall: what a rollout costs the machine
    try:
        return prof.runcall(fn)
    finally:
        try:
            prof.dump_stats(os.path.join(directory, f"agent-{os.getpid()}.prof"))
        except OSError:
            pass


def _report_new_modules(sock_path: str, names: set[str]) -> None:
    """From a child: tell the zygote which modules it had to import (best effort, ~1 ms)."""
    if not names:
        return
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(1.0)
            sock.connect(sock_path)
            sock.sendall((json.dumps({"op": "learn", "modules": sorted(names)[:MAX_LEARN]}) + "\n").encode())
    except OSError:
        pass


def _run_entry(entry: Callable[[dict[str, str]], int], env: dict[str, str]) -> int:
    try:
        code = entry(env)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        sys.stderr.write(failure_line(FailureReason.CRASH, "unhandled exception in the agent") + "\n")
        return 1
    return int(code) if isinstance(code, int) else 0


def _run_module(module: str) -> int:
    """Run a pre-imported module as ``python -m`` would: its ``main()`` when it has one."""
    mod = sys.modules.get(module)
    entry = getattr(mod, "main", None) if mod is not None else None
    sys.argv = [module]
    try:
        if callable(entry):
            code = entry()
        else:
            import runpy
            import warnings

            warnings.filterwarnings("ignore", category=RuntimeWarning, module="runpy")
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        return 1
    return code if isinstance(code, int) else 0


def _flush_and_exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code & 0xFF if code >= 0 else 1)
