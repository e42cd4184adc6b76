"""The worker's serving loop: requests on its UNIX socket, spare children, reaping.

Protocol in :mod:`calcx.worker.protocol`; what happens in a forked child in :mod:`calcx.worker.fork`.
"""

from __future__ import annotations

import gc
import json
import os
import selectors
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from calcx.contract.env import agent_base_env
from calcx.contract.ready import WORKER_READY_LINE
from calcx.procs.procutil import kill_group
from calcx.worker.fork import Forking
from calcx.worker.protocol import LEARN_ROUNDS, MAX_FDS, MAX_LEARN


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


class ZygoteServer(Forking):
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
        self.base_env = agent_base_env(os.environ)  # what every child starts from
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
        # what a `learn` request may import: submodules of the packages loaded by the time the worker
        # serves (its preload), never a new top-level module an agent placed on the import path
        self.learnable = frozenset(name.partition(".")[0] for name in sys.modules)
        self.spares: dict[int, socket.socket] = {}
        self.spare_target = spares
        self.child_nice = child_nice

    def _may_learn(self, name: str) -> bool:
        """A dotted module name below a package the worker had loaded before it served, with no
        dunder part: a package's `__main__` is its script and runs at import (some serve on the
        worker's own stdin, e.g. `mcp_server_calculator.__main__`)."""
        parts = name.split(".")
        return all(part.isidentifier() and not part.startswith("__") for part in parts) and parts[0] in self.learnable

    def _learn(self, modules: list[Any]) -> None:
        """Import what a child had to import lazily, so that later children find it loaded."""
        if self.learn_rounds <= 0:
            return
        added = 0
        for name in sorted(m for m in modules if isinstance(m, str))[:MAX_LEARN]:
            if name in sys.modules or name.startswith("__") or not self._may_learn(name):
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
        sys.stdout.write(WORKER_READY_LINE + "\n")
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
            self._reply(
                conn, {"pong": self.pid, "calc": self.calc_module is not None, "agent": self.agent_entry is not None}
            )
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
        child = self._fork(keep=list(conn.fds))
        if child is None:
            self._reply(conn, {"error": "fork failed"})
            self._close_conn(conn)
            return
        if child == 0:
            self._child_run(kind, env, list(conn.fds))
        self._assigned(conn, child, kind)

    def _assigned(self, conn: _Conn, pid: int, kind: str) -> None:
        self._close_fds(conn)
        conn.pid = pid
        conn.kind = kind
        self.children[pid] = _Child(pid, kind, time.monotonic(), conn)
        self.stats[f"{kind}_forks"] += 1
        self._reply(conn, {"pid": pid})

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
