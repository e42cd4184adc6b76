"""Start and stop the whole rollout loop on one machine: server, stub LLM, controller.

Each part runs as its own OS process (the same commands a user types), on a free loopback
port, with its log in a work directory. Everything started here is ended here, by pid and
process group. Used by ``calcx rehearse``, the throughput benchmark and the end-to-end tests.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from calcx.api.tokens import new_key
from calcx.contract.commands import controller_command, server_command
from calcx.contract.env import CALCX_KEY, service_base_env
from calcx.contract.ready import CONTROLLER_READY, SERVER_READY, STUB_LLM_READY
from calcx.procs.managed import ManagedProcess, ProcessStartError, live_pids, stop_all


def services_env(extra: dict[str, str]) -> dict[str, str]:
    """The environment of every part the stack starts (server, stub LLM, controller): the
    allowlisted part of ours (calcx.contract.env.service_base_env: no tracker, hub or cloud
    credentials), calcx's source root on PYTHONPATH, plus `extra` (the key among it). The stub
    too: it is not made non-dumpable, so an agent of the same user can read its /proc environ."""
    return {**service_base_env(python_env()), **extra}


def python_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment, calcx's source root first on PYTHONPATH, plus `extra`."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])  # .../src/python
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if src not in parts:
        env["PYTHONPATH"] = os.pathsep.join([src, *parts])
    env.update(extra or {})
    return env


@dataclass
class StackConfig:
    workdir: Path
    key: str = field(default_factory=new_key)  # a fresh key per rehearsal
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
        cmd = server_command(
            c.python, host="127.0.0.1", port=self._server_port, db=str(self.db_path), extra_args=c.server_args
        )
        env = services_env({CALCX_KEY: c.key})  # in its environment, never on its command line
        self.server = ManagedProcess("server", cmd, self.workdir / "server.log", env).start(SERVER_READY, timeout_s)
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
            except ProcessStartError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)  # the port may linger for a moment

    def start_stub(self, timeout_s: float = 60.0) -> str:
        c = self.config
        cmd = [
            c.python,
            "-m",
            "calcx.stub_llm",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--mode",
            c.stub_mode,
            "--model-name",
            c.model_name,
            *[a for f in c.script_files for a in ("--script", f)],
            *c.stub_args,
        ]
        self.stub = ManagedProcess("stub-llm", cmd, self.workdir / "stub.log", services_env({})).start(
            STUB_LLM_READY, timeout_s
        )
        assert self.stub.match is not None
        self.stub_url = self.stub.match.group(1).rstrip("/")
        if not self.stub_url.endswith("/v1"):
            self.stub_url += "/v1"
        return self.stub_url

    def register_model(self) -> None:
        from calcx.api.client import CalcxClient

        with CalcxClient(self.server_url, self.config.key) as client:
            client.put_models(self.config.model_name, [self.stub_url])

    def start_controller(
        self, controller_id: str | None = None, extra_args: Sequence[str] = (), timeout_s: float = 180.0
    ) -> ManagedProcess:
        c = self.config
        n = len(self.controllers)
        cmd = controller_command(
            c.python,
            server_url=self.server_url,
            concurrency=c.concurrency,
            controller_id=controller_id or f"rehearsal-{n}",
            log_level=os.environ.get("CALCX_STACK_LOG_LEVEL", "info"),
            log_dir=str(self.workdir / f"agents-{n}") if c.agent_logs else None,
            prefork=c.prefork,
            extra_args=[*c.controller_args, *extra_args],
        )
        env = services_env({CALCX_KEY: c.key, **c.controller_env})
        proc = ManagedProcess(f"controller-{n}", cmd, self.workdir / f"controller-{n}.log", env)
        self.controllers.append(proc)
        return proc.start(CONTROLLER_READY, timeout_s)

    def start(self) -> Stack:
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
        return live_pids(self.processes())

    # -- shutdown ------------------------------------------------------------------------
    def stop(self) -> None:
        """Controllers first (they end their agents), then the stub and the server; nothing
        started here outlives it."""
        stop_all([*((c, 20.0) for c in self.controllers), (self.stub, 10.0), (self.server, 10.0)])

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
