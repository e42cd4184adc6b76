"""The calcx server and a local-runner controller, started for one training run and ended with it.

`calcx train` needs a rollout server and a controller unless `--agl-base-url` names running ones.
Each runs as its own process (its own process group), the server on a free port of loopback (of
`calcx.services_host` on a Ray cluster, whose nodes must reach it), with a key made for this run
(the nodes' key on a cluster), a SQLite file and logs in the run's report directory. They may run under another
Python than the trainer (`calcx.services_python`), and the agent under a third one
(`calcx.agent_python` / `calcx.agent_pythonpath`): on the GPU machine the agent's packages (mcp<2)
cannot share a site directory with vLLM's (mcp 2.x).
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calcx.contract.commands import controller_command, server_command
from calcx.contract.env import (
    AGENT_PROMPT_DEFAULT,
    CALCX_AGENT_PROMPT,
    CALCX_AGENT_TOOL_ROUNDS,
    CALCX_KEY,
    TOOL_ROUNDS_DEFAULT,
    parse_agent_prompt,
    parse_tool_rounds,
    service_base_env,
)
from calcx.contract.ready import CONTROLLER_READY, SERVER_READY
from calcx.procs.managed import ManagedProcess, ProcessStartError, live_pids, stop_all
from calcx.trainer.config.scale import LOOPBACK
from calcx.worker.protocol import WORKER_MODULE

CALCX_SRC = Path(__file__).resolve().parents[3]  # .../src/python


class ServicesError(RuntimeError):
    """The server or the controller did not start; the message names the part and its log."""


def _under(path: Path, roots: Iterable[str]) -> bool:
    for root in roots:
        try:
            path.relative_to(Path(root).resolve())
            return True
        except ValueError:
            continue
    return False


def portable_sys_path() -> list[str]:
    """This process's import path minus the interpreter's own directories (stdlib, site-packages).

    What another interpreter needs to import what this one imports from source and PYTHONPATH
    (calcx's source root first), without being handed this interpreter's installed packages.
    """
    own_roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths = [str(CALCX_SRC)]
    for entry in sys.path:
        path = Path(entry or os.getcwd()).resolve()
        if not path.is_dir() or _under(path, own_roots) or path.name in ("site-packages", "dist-packages"):
            continue
        if str(path) not in paths:
            paths.append(str(path))
    return paths


def as_path_list(value: Any, *, what: str) -> list[str] | None:
    """None, an `os.pathsep`-joined string or a list of directories -> absolute paths (None = default)."""
    if value is None:
        return None
    items = value.split(os.pathsep) if isinstance(value, str) else [str(v) for v in value]
    out = [str(Path(item).expanduser().resolve()) for item in items if str(item).strip()]
    if not out:
        raise ValueError(f"{what} is empty; leave it null for the default or list the directories to import from")
    return out


def interpreter(value: Any, *, what: str) -> str:
    """A configured Python interpreter (None = this one); it must exist and be executable."""
    if value in (None, ""):
        return sys.executable
    path = Path(str(value)).expanduser()
    if not path.is_absolute() and os.sep not in str(value):
        from shutil import which

        found = which(str(value))
        if found is None:
            raise ValueError(f"{what}={value!r} is not on PATH; give the interpreter's full path")
        return found
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ValueError(f"{what}={value!r} is not an executable file; give a Python interpreter's path")
    return str(path.resolve() if not path.is_absolute() else path)


@dataclass
class ServicesConfig:
    """Where the parts run and under which interpreters and import paths."""

    workdir: Path
    host: str = LOOPBACK  # where the server listens, and the address in its URL (calcx.services_host)
    services_python: str = sys.executable
    services_pythonpath: list[str] = field(default_factory=portable_sys_path)
    agent_python: str = sys.executable
    agent_pythonpath: list[str] = field(default_factory=portable_sys_path)
    key: str = field(default_factory=lambda: "calcx-run-" + secrets.token_hex(24))
    concurrency: int = 32
    prefork: bool = True
    sandbox: str | None = None  # the controller's --sandbox, forwarded (it checks the value)
    agent_logs: bool = False
    tool_rounds: int = TOOL_ROUNDS_DEFAULT
    prompt: str = AGENT_PROMPT_DEFAULT
    server_args: Sequence[str] = ()
    controller_args: Sequence[str] = ()
    start_timeout_s: float = 180.0

    @classmethod
    def from_calcx_section(cls, calcx: Any, workdir: Path) -> ServicesConfig:
        """Read `calcx.services_python`, `services_pythonpath`, `agent_python`, `agent_pythonpath`,
        `controller_concurrency`, `prefork`, `agent_sandbox`, `agent_logs`, `agent_tool_rounds`,
        `agent_prompt`, `server_args` and `controller_args` (null = default)."""
        get = calcx.get
        services_path = as_path_list(get("services_pythonpath"), what="calcx.services_pythonpath")
        agent_path = as_path_list(get("agent_pythonpath"), what="calcx.agent_pythonpath")
        concurrency = int(get("controller_concurrency") or 32)
        rounds = get("agent_tool_rounds")
        prompt = get("agent_prompt")
        if concurrency < 1:
            raise ValueError(f"calcx.controller_concurrency={concurrency} must be at least 1")
        return cls(
            workdir=workdir,
            services_python=interpreter(get("services_python"), what="calcx.services_python"),
            services_pythonpath=services_path if services_path is not None else portable_sys_path(),
            agent_python=interpreter(get("agent_python"), what="calcx.agent_python"),
            agent_pythonpath=agent_path if agent_path is not None else portable_sys_path(),
            concurrency=concurrency,
            prefork=bool(get("prefork", True)),
            sandbox=None if get("agent_sandbox") is None else str(get("agent_sandbox")),
            agent_logs=bool(get("agent_logs", False)),
            tool_rounds=parse_tool_rounds(
                TOOL_ROUNDS_DEFAULT if rounds is None else rounds, what="calcx.agent_tool_rounds"
            ),
            prompt=parse_agent_prompt(AGENT_PROMPT_DEFAULT if prompt is None else prompt, what="calcx.agent_prompt"),
            server_args=[str(a) for a in (get("server_args") or [])],
            controller_args=[str(a) for a in (get("controller_args") or [])],
        )

    def agent_settings(self) -> dict[str, str]:
        """The agents' settings, in the controller's environment (its agents inherit them)."""
        return {CALCX_AGENT_TOOL_ROUNDS: str(self.tool_rounds), CALCX_AGENT_PROMPT: self.prompt}

    def agent_commands(self) -> list[str]:
        """Controller flags that run the agent (and its pre-forked worker) under the agent's Python."""
        if self.agent_python == self.services_python and self.agent_pythonpath == self.services_pythonpath:
            return []  # the controller's own interpreter and path: its defaults do it
        import json

        prefix = ["env", "PYTHONPATH=" + os.pathsep.join(self.agent_pythonpath), self.agent_python, "-m"]
        return [
            "--agent-cmd",
            json.dumps(prefix + ["calcx.agent"]),
            "--worker-cmd",
            json.dumps(prefix + [WORKER_MODULE]),
        ]


def services_env(
    pythonpath: Sequence[str], extra: dict[str, str], base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The started server's and controller's environment: the allowlisted part of ours
    (calcx.contract.env.service_base_env; no tracker or hub credentials), their import path, `extra`."""
    env = service_base_env(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    env.pop("PYTHONHOME", None)
    env.update(extra)
    return env


class LocalServices:
    """Server + controller (local runner). A context manager; `stop()` ends every process it started."""

    def __init__(self, config: ServicesConfig) -> None:
        self.config = config
        self.workdir = Path(config.workdir).resolve()
        self.db_path = self.workdir / "calcx.db"
        self.server: ManagedProcess | None = None
        self.controller: ManagedProcess | None = None
        self.server_url = ""

    @property
    def key(self) -> str:
        return self.config.key

    def start(self) -> LocalServices:
        self.start_server()
        return self.start_controller()

    def _env(self) -> dict[str, str]:
        return services_env(self.config.services_pythonpath, {CALCX_KEY: self.config.key})

    def start_server(self) -> LocalServices:
        """The server alone: `calcx train` takes its run's lease before a controller claims anything."""
        c = self.config
        self.workdir.mkdir(parents=True, exist_ok=True)
        server_cmd = server_command(
            c.services_python, host=c.host, port=0, db=str(self.db_path), extra_args=c.server_args
        )
        # both die with calcx train, even a SIGKILLed one: a second start finds no old controller
        # still claiming from the run's database (docs/resume.md)
        server = self.server = ManagedProcess(
            "calcx server", server_cmd, self.workdir / "server.log", self._env(), die_with_parent=True
        )
        self._starting(lambda: server.start(SERVER_READY, c.start_timeout_s))
        assert server.match is not None
        self.server_url = server.match.group(1).rstrip("/")
        return self

    def start_controller(self) -> LocalServices:
        c = self.config
        controller_cmd = controller_command(
            c.services_python,
            server_url=self.server_url,
            concurrency=c.concurrency,
            controller_id="calcx-train",
            log_dir=str(self.workdir / "agents") if c.agent_logs else None,
            agent_commands=c.agent_commands(),
            prefork=c.prefork,
            sandbox=c.sandbox,
            extra_args=c.controller_args,
        )
        controller = self.controller = ManagedProcess(
            "calcx controller",
            controller_cmd,
            self.workdir / "controller.log",
            {**self._env(), **c.agent_settings()},
            die_with_parent=True,
        )
        self._starting(lambda: controller.start(CONTROLLER_READY, c.start_timeout_s))
        return self

    def _starting(self, start: Callable[[], object]) -> None:
        """Run one start; a failure stops everything started here and names the interpreter."""
        try:
            start()
        except ProcessStartError as exc:
            self.stop()
            raise ServicesError(f"{exc} (interpreter {self.config.services_python})") from exc
        except BaseException:
            self.stop()
            raise

    def pids(self) -> set[int]:
        """Every live process started here, their children included."""
        return live_pids(p for p in (self.server, self.controller) if p is not None)

    def stop(self) -> None:
        """The controller first (it ends its agents), then the server; nothing started here outlives it."""
        stop_all([(self.controller, 20.0), (self.server, 10.0)])

    def __enter__(self) -> LocalServices:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
