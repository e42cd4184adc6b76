"""Pre-forked agent worker ("zygote"): pay for imports once, fork one process per rollout.

Starting ``python -m calcx.agent`` costs about 1.4 s of imports (AutoGen, openai, mcp) and the
MCP calculator another ~0.5 CPU-s, per rollout. A zygote is the agent artifact started once in
worker mode (``python -m calcx.controller.zygote --socket PATH``): it imports
``calcx.agent.main`` and the calculator module, then serves requests on a UNIX socket:

- ``{"op": "agent", "env": {...}}`` with one fd (SCM_RIGHTS) for the child's stdout+stderr:
  fork a child in its own process group that calls ``run_agent(env)`` and exits with its code.
  Replies ``{"pid": N}`` then, when the child is reaped, ``{"exit": {...}}`` (code or signal,
  wall and CPU seconds). ``{"op": "kill"}`` on the same connection kills the child's process
  group; a connection that closes early kills it too.
- ``{"op": "calc"}`` with three fds (the caller's stdin, stdout, stderr): fork a calculator
  process bound to those fds (sent by the tiny launcher in :mod:`calcx.controller.launcher`);
  the calculator dies as soon as the launcher's connection closes.
- ``{"op": "ping"}`` / ``{"op": "stats"}``: readiness and cumulative child CPU.

The zygote is single-threaded and never runs an event loop, so forking it is safe; every child
gets a fresh event loop of its own. Children carry PR_SET_PDEATHSIG, so a zygote that dies
takes its children along, and the zygote exits when its stdin (a pipe from the controller)
closes.
"""

from __future__ import annotations

import argparse
import errno
import gc
import json
import os
import selectors
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from calcx.contract.ready import WORKER_READY_LINE as READY_LINE
from calcx.controller.procutil import kill_group, set_parent_death_signal, set_process_name

MAX_FDS = 8
LEARN_ROUNDS = 8  # children that may report lazily imported modules back
MAX_LEARN = 5000


@dataclass
class _Conn:
    sock: socket.socket
    buf: bytearray = field(default_factory=bytearray)
    fds: list[int] = field(default_factory=list)
    pid: int | None = None
    kind: str | None = None


@dataclass
class _Child:
    pid: int
    kind: str
    started: float
    conn: _Conn | None


def _default_calculator_module() -> str | None:
    """The module that ``python -m`` runs for the calculator, or None when it is not one."""
    try:
        from calcx.agent.calculator import calculator_command
    except Exception:  # the agent package has no calculator command: no calculator zygote
        return None
    saved = os.environ.pop("CALCX_CALCULATOR_CMD", None)
    try:
        cmd = list(calculator_command())
    finally:
        if saved is not None:
            os.environ["CALCX_CALCULATOR_CMD"] = saved
    if len(cmd) == 3 and cmd[1] == "-m":
        return cmd[2]
    return None


class Zygote:
    """The serving loop. ``serve()`` returns only in the zygote process itself."""

    def __init__(
        self,
        sock_path: str,
        agent_entry: Callable[[dict[str, str]], int] | None,
        calc_module: str | None,
        control_fd: int | None = 0,
        spares: int = 4,
        child_nice: int = 0,
    ) -> None:
        self.sock_path = sock_path
        self.agent_entry = agent_entry
        self.calc_module = calc_module
        self.control_fd = control_fd
        self.base_env = dict(os.environ)
        self.pid = os.getpid()
        self.children: dict[int, _Child] = {}
        self.conns: dict[int, _Conn] = {}
        self.stats: dict[str, float] = {
            "agent_forks": 0,
            "calc_forks": 0,
            "agent_cpu_s": 0.0,
            "calc_cpu_s": 0.0,
            "agent_wall_s": 0.0,
            "fork_s": 0.0,
        }
        self._stopping = False
        self.learn_rounds = LEARN_ROUNDS
        self.spares: dict[int, socket.socket] = {}
        self.spare_target = spares
        self.child_nice = child_nice

    def _learn(self, modules: list[Any]) -> None:
        """Import what a child had to import lazily, so that later children find it loaded."""
        if self.learn_rounds <= 0:
            return
        added = 0
        for name in sorted(m for m in modules if isinstance(m, str))[:MAX_LEARN]:
            if name in sys.modules or name.startswith("__"):
                continue
            try:
                __import__(name)
                added += 1
            except BaseException:  # noqa: BLE001 - a module that cannot be imported here is skipped
                continue
        if added:
            self.learn_rounds -= 1
            gc.collect()
            gc.freeze()
            sys.stderr.write(f"calcx-zygote: preloaded {added} more modules a rollout imported lazily\n")
            sys.stderr.flush()
        import threading

        if threading.active_count() > 1:
            sys.stderr.write(
                f"calcx-zygote: warning: {threading.active_count()} threads after preloading; forking may be unsafe\n"
            )

    # -- setup ---------------------------------------------------------------------------
    def _open(self) -> None:
        try:
            os.unlink(self.sock_path)
        except FileNotFoundError:
            pass
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o077)
        try:
            self.listener.bind(self.sock_path)
        finally:
            os.umask(old_umask)
        self.listener.listen(256)
        self.listener.setblocking(False)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ, "listen")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")
        if self.control_fd is not None:
            try:
                os.fstat(self.control_fd)
                self.sel.register(self.control_fd, selectors.EVENT_READ, "control")
            except (OSError, ValueError):
                self.control_fd = None

    def _on_term(self, *_: Any) -> None:
        self._stopping = True

    # -- main loop -----------------------------------------------------------------------
    def serve(self) -> int:
        self._open()
        sys.stdout.write(READY_LINE + "\n")
        sys.stdout.flush()
        while not self._stopping:
            want_spare = len(self.spares) < self.spare_target
            try:
                events = self.sel.select(timeout=0 if want_spare else 1.0)
            except InterruptedError:
                continue
            if not events and want_spare:
                self._fork_spare()  # only when no request is waiting
                continue
            for key, _ in events:
                tag = key.data
                if tag == "listen":
                    self._accept()
                elif tag == "wake":
                    self._drain_wake()
                    self._reap()
                elif tag == "control":
                    if not self._read_control():
                        self._stopping = True
                elif isinstance(tag, _Conn):
                    self._on_conn(tag)
            self._reap()
        self._shutdown()
        return 0

    def _read_control(self) -> bool:
        try:
            data = os.read(self.control_fd, 4096)  # type: ignore[arg-type]
        except BlockingIOError:
            return True
        except OSError:
            return False
        return bool(data)

    def _drain_wake(self) -> None:
        try:
            while os.read(self.wake_r, 512):
                pass
        except (BlockingIOError, OSError):
            pass

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            sock.setblocking(False)
            conn = _Conn(sock)
            self.conns[sock.fileno()] = conn
            self.sel.register(sock, selectors.EVENT_READ, conn)

    def _on_conn(self, conn: _Conn) -> None:
        try:
            data, fds, _flags, _addr = socket.recv_fds(conn.sock, 1 << 16, MAX_FDS)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, fds = b"", []
        conn.fds.extend(fds)
        if not data:
            self._conn_closed(conn)
            return
        conn.buf.extend(data)
        while b"\n" in conn.buf:
            line, _, rest = bytes(conn.buf).partition(b"\n")
            conn.buf = bytearray(rest)
            try:
                msg = json.loads(line)
            except ValueError:
                self._reply(conn, {"error": "request is not one JSON object per line"})
                self._close_conn(conn)
                return
            self._handle(conn, msg)
            if conn.sock.fileno() < 0:
                return

    def _handle(self, conn: _Conn, msg: dict[str, Any]) -> None:
        op = msg.get("op")
        if op == "ping":
            self._reply(conn, {"pong": self.pid, "calc": self.calc_module is not None,
                               "agent": self.agent_entry is not None})
        elif op == "stats":
            self._reply(conn, {"stats": self.stats, "children": len(self.children)})
        elif op == "agent" and conn.pid is None:
            if self.agent_entry is None or len(conn.fds) != 1:
                self._reply(conn, {"error": "agent request needs one output fd and an agent entry"})
                self._close_conn(conn)
                return
            env = msg.get("env") or {}
            if not isinstance(env, dict) or not all(
                isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in env.items()
            ):
                self._reply(conn, {"error": "env must map strings to strings (or null to unset)"})
                self._close_conn(conn)
                return
            self._start(conn, "agent", env)
        elif op == "calc" and conn.pid is None:
            if self.calc_module is None or len(conn.fds) != 3:
                self._reply(conn, {"error": "calc request needs three fds and a calculator module"})
                self._close_conn(conn)
                return
            self._start(conn, "calc", {})
        elif op == "learn":
            self._learn(msg.get("modules") or [])
            self._close_conn(conn)
        elif op == "kill" and conn.pid is not None:
            kill_group(conn.pid)
        else:
            self._reply(conn, {"error": f"unknown or out-of-order op {op!r}"})

    def _reply(self, conn: _Conn, msg: dict[str, Any]) -> None:
        data = (json.dumps(msg) + "\n").encode()
        try:
            conn.sock.setblocking(True)
            conn.sock.settimeout(2.0)
            conn.sock.sendall(data)
        except OSError:
            pass
        finally:
            try:
                conn.sock.setblocking(False)
            except OSError:
                pass

    def _close_fds(self, conn: _Conn) -> None:
        for fd in conn.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        conn.fds = []

    def _close_conn(self, conn: _Conn) -> None:
        self._close_fds(conn)
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        self.conns.pop(conn.sock.fileno(), None)
        conn.sock.close()

    def _conn_closed(self, conn: _Conn) -> None:
        """The client went away: a child it asked for must not outlive it."""
        if conn.pid is not None and conn.pid in self.children:
            kill_group(conn.pid)
            self.children[conn.pid].conn = None
        self._close_conn(conn)

    # -- forking -------------------------------------------------------------------------
    def _start(self, conn: _Conn, kind: str, env: dict[str, str | None]) -> None:
        """Give the job to an idle spare child, or fork one now when there is none."""
        job = (json.dumps({"kind": kind, "env": env}) + "\n").encode()
        while self.spares:
            pid, sock = self.spares.popitem()
            try:
                socket.send_fds(sock, [job], conn.fds)
            except OSError:
                sock.close()
                continue  # that spare died; its exit is reaped as an unassigned child
            sock.close()
            self._assigned(conn, pid, kind)
            return
        pid = self._fork(keep=list(conn.fds))
        if pid is None:
            self._reply(conn, {"error": "fork failed"})
            self._close_conn(conn)
            return
        if pid == 0:
            self._child_run(kind, env, list(conn.fds))
        self._assigned(conn, pid, kind)

    def _assigned(self, conn: _Conn, pid: int, kind: str) -> None:
        self._close_fds(conn)
        conn.pid = pid
        conn.kind = kind
        self.children[pid] = _Child(pid, kind, time.monotonic(), conn)
        self.stats[f"{kind}_forks"] += 1
        self._reply(conn, {"pid": pid})

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
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
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
            sys.stderr.write("calcx-agent: failure: crash the worker could not start the rollout\n")
        finally:
            _flush_and_exit(code)

    def _agent_child(self, env: dict[str, str | None], out_fd: int) -> int:
        null = os.open(os.devnull, os.O_RDONLY)
        _install_fds([null, out_fd, out_fd])
        full_env = dict(self.base_env)
        for name, value in env.items():
            if value is None:
                full_env.pop(name, None)
            else:
                full_env[name] = value
        os.environ.clear()
        os.environ.update(full_env)
        sys.argv = ["calcx-agent"]
        before = set(sys.modules) if self.learn_rounds > 0 else None
        profile_dir = self.base_env.get("CALCX_ZYGOTE_PROFILE_DIR")
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

    # -- reaping -------------------------------------------------------------------------
    def _reap(self) -> None:
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            except InterruptedError:
                continue
            if pid == 0:
                return
            child = self.children.pop(pid, None)
            if child is None:
                spare = self.spares.pop(pid, None)
                if spare is not None:
                    spare.close()
                continue
            wall = time.monotonic() - child.started
            cpu = usage.ru_utime + usage.ru_stime
            self.stats[f"{child.kind}_cpu_s"] += cpu
            if child.kind == "agent":
                self.stats["agent_wall_s"] += wall
            # Whatever the child left in its group (helpers that did not set up their own
            # session) goes with it.
            kill_group(pid)
            info: dict[str, Any] = {"wall_s": wall, "cpu_s": cpu, "status": status}
            if os.WIFSIGNALED(status):
                info["signal"] = os.WTERMSIG(status)
                info["code"] = None
            else:
                info["code"] = os.waitstatus_to_exitcode(status)
                info["signal"] = None
            if child.conn is not None:
                self._reply(child.conn, {"exit": info})
                self._close_conn(child.conn)

    def _shutdown(self) -> None:
        for pid, sock in list(self.spares.items()):
            sock.close()
            kill_group(pid)
        for pid in list(self.children):
            kill_group(pid)
        deadline = time.monotonic() + 5.0
        while (self.children or self.spares) and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.01)
        for conn in list(self.conns.values()):
            self._close_conn(conn)
        try:
            os.unlink(self.sock_path)
        except OSError:
            pass


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
        sys.stderr.write("calcx-agent: failure: crash unhandled exception in the agent\n")
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


#: Modules a rollout imports lazily; importing them in the zygote keeps every child from paying.
DEFAULT_PRELOAD = (
    "calcx.agent.main",
    "calcx.agent.rollout",
    "calcx.agent.reward_post",
    "calcx.agent.calculator",
    "mcp_server_calculator.calculator",
    "anyio._backends._asyncio",  # the event-loop backend anyio loads on first use
    "anyio.streams.stapled",
    "anyio.streams.tls",
)


def preload(extra: list[str] | None = None) -> tuple[Callable[[dict[str, str]], int] | None, str | None]:
    """Import what every rollout needs, once: the agent entry and the calculator module."""
    from calcx.agent.main import run_agent

    calc_module = _default_calculator_module()
    for name in [*DEFAULT_PRELOAD, *(extra or []), *([calc_module] if calc_module else [])]:
        try:
            __import__(name)
        except ImportError as exc:
            sys.stderr.write(f"calcx-zygote: not preloading {name}: {exc}\n")
    return run_agent, calc_module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m calcx.controller.zygote",
        description="Pre-forked agent worker: imports the agent once and forks one process per rollout.",
    )
    parser.add_argument("--socket", required=True, help="UNIX socket path to serve on")
    parser.add_argument("--no-calculator", action="store_true", help="do not serve calculator processes")
    parser.add_argument("--preload", action="append", default=[], help="another module to import before forking")
    parser.add_argument("--no-warmup", action="store_true", help="skip filling library caches before forking")
    parser.add_argument("--spares", type=int, default=4, help="children forked ahead of demand (default 4)")
    parser.add_argument("--child-nice", type=int, default=5,
                        help="niceness added to rollout processes, so orchestration keeps its CPU (default 5)")
    args = parser.parse_args(argv)
    set_parent_death_signal(signal.SIGKILL)
    set_process_name("calcx-zygote")
    t0 = time.perf_counter()
    agent_entry, calc_module = preload(args.preload)
    if args.no_calculator:
        calc_module = None
    warm: dict[str, Any] = {}
    if not args.no_warmup:
        from calcx.controller.warmup import warm_all

        warm = warm_all()
    gc.collect()
    gc.freeze()  # keep the imported heap out of the collector: children share it copy-on-write
    sys.stderr.write(
        f"calcx-zygote: preloaded in {time.perf_counter() - t0:.2f}s (calculator module: {calc_module}; warm-up {warm})\n"
    )
    sys.stderr.flush()
    try:
        return Zygote(args.socket, agent_entry, calc_module, spares=max(0, args.spares),
                      child_nice=max(0, args.child_nice)).serve()
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            sys.stderr.write(f"calcx-zygote: socket {args.socket} is in use\n")
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
