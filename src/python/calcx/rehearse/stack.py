"""Start and stop the whole rollout loop on one machine: server, stub LLM, controller.

Each part runs as its own OS process (the same commands a user types), on a free loopback
port, with its log in a work directory. Everything started here is ended here, by pid and
process group. Used by ``calcx rehearse``, the throughput benchmark and the end-to-end tests.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from calcx.contract.ready import CONTROLLER_READY, SERVER_READY
from calcx.contract.ready import STUB_LLM_READY as STUB_READY
from calcx.controller.procutil import descendants, kill_group, process_start_time


class StackError(RuntimeError):
    """A part of the stack did not start; the message names it and its log."""


def _python_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])  # .../src/python
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if src not in parts:
        env["PYTHONPATH"] = os.pathsep.join([src, *parts])
    env.update(extra or {})
    return env


@dataclass
class ManagedProcess:
    """A child process in its own process group, its stdout scanned for a ready line."""

    name: str
    cmd: list[str]
    log_path: Path
    env: dict[str, str]
    proc: subprocess.Popen[str] | None = None
    match: re.Match[str] | None = None
    lines: list[str] = field(default_factory=list)
    _ready: threading.Event = field(default_factory=threading.Event)

    def start(self, ready: re.Pattern[str] | None, timeout_s: float = 120.0) -> "ManagedProcess":
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                self.cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, env=self.env,
                text=True, start_new_session=True,
            )
        finally:
            log.close()
        threading.Thread(target=self._pump, args=(ready,), name=f"{self.name}-stdout", daemon=True).start()
        if ready is None:
            return self
        deadline = time.monotonic() + timeout_s
        while not self._ready.wait(0.05):
            if self.proc.poll() is not None:
                raise StackError(f"{self.name} exited with {self.proc.returncode} before it was ready; see {self.log_path}")
            if time.monotonic() > deadline:
                self.stop()
                raise StackError(f"{self.name} was not ready after {timeout_s:.0f}s; see {self.log_path}")
        return self

    def _pump(self, ready: re.Pattern[str] | None) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with open(self.log_path.with_suffix(".out"), "a") as out:
            for line in self.proc.stdout:
                out.write(line)
                out.flush()
                if len(self.lines) < 1000:
                    self.lines.append(line.rstrip("\n"))
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
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                kill_group(self.proc.pid)
                self.proc.wait(10)
        kill_group(self.proc.pid)  # anything left in its group
        return self.proc.returncode


@dataclass
class StackConfig:
    workdir: Path
    key: str = "calcx-rehearsal-key"
    concurrency: int = 8
    prefork: bool = True
    stub_mode: str = "normal"
    stub_args: Sequence[str] = ()
    script_files: Sequence[str] = ()
    server_args: Sequence[str] = ()
    controller_args: Sequence[str] = ()
    controller_env: dict[str, str] = field(default_factory=dict)
    model_name: str = "calcx-stub"
    python: str = sys.executable
    agent_logs: bool = False


class Stack:
    """Server + stub LLM + controller (local runner). Use as a context manager or call stop()."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.workdir = Path(config.workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.db_path = self.workdir / "calcx.db"
        self.server: ManagedProcess | None = None
        self.stub: ManagedProcess | None = None
        self.controllers: list[ManagedProcess] = []
        self.server_url = ""
        self.stub_url = ""
        self._server_port = 0

    # -- parts ---------------------------------------------------------------------------
    def start_server(self, timeout_s: float = 60.0) -> str:
        c = self.config
        cmd = [c.python, "-m", "calcx.server", "--host", "127.0.0.1", "--port", str(self._server_port),
               "--db", str(self.db_path), "--key", c.key, "--log-level", "warning", *c.server_args]
        self.server = ManagedProcess("server", cmd, self.workdir / "server.log", _python_env()).start(SERVER_READY, timeout_s)
        assert self.server.match is not None
        self.server_url = self.server.match.group(1)
        self._server_port = int(self.server_url.rsplit(":", 1)[1].split("/")[0])
        return self.server_url

    def restart_server(self, timeout_s: float = 60.0) -> str:
        """Stop the server and start it again on the same port and database."""
        assert self.server is not None
        self.server.stop()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.start_server(timeout_s)
            except StackError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)  # the port may linger for a moment

    def start_stub(self, timeout_s: float = 60.0) -> str:
        c = self.config
        cmd = [c.python, "-m", "calcx.stub_llm", "--host", "127.0.0.1", "--port", "0", "--mode", c.stub_mode,
               "--model-name", c.model_name, *[a for f in c.script_files for a in ("--script", f)], *c.stub_args]
        self.stub = ManagedProcess("stub-llm", cmd, self.workdir / "stub.log", _python_env()).start(STUB_READY, timeout_s)
        assert self.stub.match is not None
        self.stub_url = self.stub.match.group(1).rstrip("/")
        if not self.stub_url.endswith("/v1"):
            self.stub_url += "/v1"
        return self.stub_url

    def register_model(self) -> None:
        from calcx.api.client import CalcxClient

        with CalcxClient(self.server_url, self.config.key) as client:
            client.put_models(self.config.model_name, [self.stub_url])

    def start_controller(self, controller_id: str | None = None, extra_args: Sequence[str] = (),
                         timeout_s: float = 180.0) -> ManagedProcess:
        c = self.config
        n = len(self.controllers)
        cmd = [c.python, "-m", "calcx.controller", "--runner", "local", "--server", self.server_url,
               "--concurrency", str(c.concurrency), "--controller-id", controller_id or f"rehearsal-{n}",
               "--log-level", os.environ.get("CALCX_STACK_LOG_LEVEL", "info"), *c.controller_args, *extra_args]
        if not c.prefork:
            cmd.append("--no-prefork")
        if c.agent_logs:
            cmd += ["--log-dir", str(self.workdir / f"agents-{n}")]
        env = _python_env({"CALCX_KEY": c.key, **c.controller_env})
        proc = ManagedProcess(f"controller-{n}", cmd, self.workdir / f"controller-{n}.log", env)
        self.controllers.append(proc)
        return proc.start(CONTROLLER_READY, timeout_s)

    def start(self) -> "Stack":
        try:
            self.start_server()
            self.start_stub()
            self.register_model()
            self.start_controller()
        except BaseException:
            self.stop()
            raise
        return self

    # -- inspection ----------------------------------------------------------------------
    def processes(self) -> list[ManagedProcess]:
        return [p for p in (self.server, self.stub, *self.controllers) if p is not None]

    def all_pids(self) -> set[int]:
        """Every live process of the stack, children included."""
        pids: set[int] = set()
        for p in self.processes():
            if p.alive():
                pids.add(p.pid)
                pids |= descendants(p.pid)
        return pids

    # -- shutdown ------------------------------------------------------------------------
    def stop(self) -> None:
        """Controllers first (they end their agents), then the stub and the server."""
        tree: dict[int, int | None] = {}
        for p in self.processes():
            if p.alive():
                tree.update({pid: process_start_time(pid) for pid in descendants(p.pid)})
        for controller in self.controllers:
            controller.stop(grace_s=20.0)
        for part in (self.stub, self.server):
            if part is not None:
                part.stop()
        for pid, started in tree.items():  # nothing may outlive the stack
            if started is not None and process_start_time(pid) == started:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def __enter__(self) -> "Stack":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
