"""Local runner: one isolated OS process per rollout, running the agent artifact.

Two ways to get that process:

- pre-forked (default): a zygote (:mod:`calcx.worker`) that already imported the
  agent forks a child per rollout, in its own process group, with the claim's environment and
  its output on a pipe; calculators come from the same zygote through a tiny launcher.
- plain spawn (``prefork=False``, ``--no-prefork``): ``agent_cmd`` (default
  ``python -m calcx.agent``) as a new session, for debugging or when the worker cannot start.
- sealed spawn (``sandbox="namespace"``, ``--sandbox namespace``): plain spawn, each agent in
  namespaces of its own (:mod:`calcx.controller.sandbox`).

Either way the deadline kills the whole process group (FAILED ``timeout``), exit 0 is SUCCEEDED,
a non-zero exit is FAILED with the agent's own reason, and death by a signal is ``crash``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from calcx.contract.env import CALCX_CALCULATOR_CMD, agent_base_env, env_problem
from calcx.contract.failures import FailureReason, reason_from_agent_exit
from calcx.controller.base import RunResult
from calcx.controller.sandbox import NAMESPACE, NONE, SANDBOX_MODES, NamespaceSandbox
from calcx.procs.procutil import kill_group
from calcx.worker.client import ChildExit, ZygoteClient, ZygoteUnavailable, default_zygote_command
from calcx.worker.launcher import as_env_value, exec_command, handoff_command

if TYPE_CHECKING:  # pragma: no cover
    from calcx.api.models import Claim

log = logging.getLogger("calcx.controller.local")

DEFAULT_TAIL_BYTES = 16 * 1024
DETAIL_LINES = 20


def lazy_ca_settings(env: Mapping[str, str]) -> dict[str, str | None] | None:
    """Environment changes that make agents' SSL contexts cheap without changing whom they trust.

    HTTP clients (httpx, openai) build an SSL context per client even for plain-http URLs. With
    a CA *file* (certifi's, or the system bundle through ``SSL_CERT_FILE``) that parses ~150
    certificates, ~50 ms of CPU, twice per rollout. With ``SSL_CERT_DIR`` pointing at the
    system's hashed CA directory, OpenSSL looks a certificate up only when a handshake needs it.
    Applied only when the agent would otherwise use the system trust store (``SSL_CERT_FILE``
    unset or the system bundle itself, ``SSL_CERT_DIR`` unset or the system directory); a custom
    trust setting is left alone. Returns {name: value or None to unset}, or None.
    """
    import re
    import ssl

    paths = ssl.get_default_verify_paths()
    capath = paths.openssl_capath
    if not capath or not os.path.isdir(capath):
        return None
    try:
        if not any(re.fullmatch(r"[0-9a-fA-F]{8}\.\d+", name) for name in os.listdir(capath)):
            return None
    except OSError:
        return None
    capath = os.path.realpath(capath)
    cert_file = env.get("SSL_CERT_FILE")
    if cert_file and os.path.realpath(cert_file) != os.path.realpath(paths.openssl_cafile):
        return None
    cert_dir = env.get("SSL_CERT_DIR")
    if cert_dir and os.path.realpath(cert_dir) != capath:
        return None
    return {"SSL_CERT_DIR": capath, "SSL_CERT_FILE": None}


def default_agent_command(python: str | None = None) -> list[str]:
    return [python or sys.executable, "-m", "calcx.agent"]


class _OutputTail(asyncio.Protocol):
    """Keeps the last bytes a child wrote (stdout and stderr share one pipe) and tees to a log."""

    def __init__(self, limit: int, log_file: Any | None) -> None:
        self.limit = limit
        self.buf = bytearray()
        self.log_file = log_file
        self.closed = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.buf.extend(data)
        if len(self.buf) > 2 * self.limit:
            del self.buf[: len(self.buf) - self.limit]
        if self.log_file is not None:
            self.log_file.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def text(self) -> str:
        return bytes(self.buf[-self.limit :]).decode(errors="replace")


def _detail(tail: str, prefix: str | None = None) -> str | None:
    lines = [line for line in tail.splitlines() if line.strip()][-DETAIL_LINES:]
    parts = ([prefix] if prefix else []) + lines
    return "\n".join(parts) if parts else None


class LocalRunner:
    """Runs each claim as a local process; see the module docstring."""

    name = "local"

    def __init__(
        self,
        *,
        agent_cmd: list[str] | None = None,
        prefork: bool = True,
        zygote_cmd: list[str] | None = None,
        env: Mapping[str, str] | None = None,
        log_dir: str | None = None,
        tail_bytes: int = DEFAULT_TAIL_BYTES,
        fallback_to_spawn: bool = True,
        lazy_ca: bool = True,
        child_nice: int = 5,
        sandbox: str = NONE,
    ) -> None:
        if sandbox not in SANDBOX_MODES:
            raise ValueError(f"sandbox {sandbox!r} is not one of {', '.join(SANDBOX_MODES)}")
        if sandbox == NAMESPACE and prefork:
            raise ValueError("the namespace sandbox spawns each agent: it needs prefork=False")
        self.agent_cmd = list(agent_cmd) if agent_cmd else default_agent_command()
        self.prefork = prefork
        self.zygote_cmd = list(zygote_cmd) if zygote_cmd else default_zygote_command()
        # only what an agent may inherit: never the server key or the controller's credentials
        self.base_env = agent_base_env(os.environ if env is None else env)
        self.log_dir = log_dir
        self.tail_bytes = tail_bytes
        self.fallback_to_spawn = fallback_to_spawn
        self.child_nice = child_nice
        self.ca_settings = lazy_ca_settings(self.base_env) if lazy_ca else None
        # planned here, checked by start(): a machine that cannot seal an agent runs none
        self.sandbox = (
            NamespaceSandbox.plan(
                self.agent_cmd, self.base_env, default_agent=self.agent_cmd == default_agent_command()
            )
            if sandbox == NAMESPACE
            else None
        )
        self.zygote: ZygoteClient | None = None
        self._live: dict[int, str] = {}  # pgid -> "rid/aid", for close()
        self.spawned = 0
        self.forked = 0
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        if self.sandbox is not None:
            await asyncio.to_thread(self.sandbox.check)
        if self.prefork:
            zlog = os.path.join(self.log_dir, "zygote.log") if self.log_dir else None
            self.zygote = ZygoteClient(self.zygote_cmd, env=self.base_env, log_path=zlog)
            try:
                await self.zygote.ensure()
            except ZygoteUnavailable:
                if not self.fallback_to_spawn:
                    raise
                log.exception("agent worker unavailable; rollouts will be spawned one process each")

    async def close(self) -> None:
        for pgid in list(self._live):
            kill_group(pgid)
        if self.zygote is not None:
            await self.zygote.close()

    async def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"forked": self.forked, "spawned": self.spawned}
        if self.zygote is not None:
            out["zygote"] = await self.zygote.stats()
            out["zygote_pid"] = self.zygote.pid
            out["zygote_restarts"] = self.zygote.restarts
        return out

    # -- one rollout ---------------------------------------------------------------------
    def _agent_env(self, claim: Claim, calc_via_zygote: bool) -> dict[str, str | None]:
        """The claim's environment plus the runner's settings; a None value unsets a variable."""
        env: dict[str, str | None] = dict(claim.env)
        if self.ca_settings and "SSL_CERT_FILE" not in claim.env and "SSL_CERT_DIR" not in claim.env:
            env.update(self.ca_settings)
        user_calc = env.get(CALCX_CALCULATOR_CMD) or self.base_env.get(CALCX_CALCULATOR_CMD)
        if user_calc:
            env[CALCX_CALCULATOR_CMD] = user_calc  # an explicit choice wins
        elif calc_via_zygote and self.zygote is not None:
            env[CALCX_CALCULATOR_CMD] = as_env_value(handoff_command(self.zygote.sock_path))
        elif self.agent_cmd == default_agent_command():
            # Same interpreter as the agent: wrap its default calculator so it dies with the agent.
            calc = [sys.executable, "-m", "calcx.agent.calculator"]
            env[CALCX_CALCULATOR_CMD] = as_env_value(exec_command(calc))
        return env

    async def run(self, claim: Claim) -> RunResult:
        rid, aid = claim.rollout.rollout_id, claim.attempt_id
        label = f"{rid}/{aid}"
        for name, value in claim.env.items():
            problem = env_problem(name, value)
            if problem is not None:  # a retry cannot help: the input itself is the cause
                log.warning("not starting %s: %s", label, problem)
                return RunResult.failed(FailureReason.BAD_ENVIRONMENT, detail=f"cannot start the agent: {problem}")
        log_file = None
        if self.log_dir:
            safe = label.replace("/", ".")
            # unbuffered: a running agent's log can be followed as it writes
            log_file = open(os.path.join(self.log_dir, f"{safe}.log"), "ab", buffering=0)
        loop = asyncio.get_running_loop()
        read_fd, write_fd = os.pipe()
        transport, tail = await loop.connect_read_pipe(
            lambda: _OutputTail(self.tail_bytes, log_file), os.fdopen(read_fd, "rb", 0)
        )
        try:
            use_zygote = self.prefork and self.zygote is not None
            if use_zygote:
                try:
                    await self.zygote.ensure()  # type: ignore[union-attr]
                except ZygoteUnavailable:
                    if not self.fallback_to_spawn:
                        raise
                    log.warning("agent worker unavailable; spawning %s as a plain process", label)
                    use_zygote = False
            if use_zygote:
                return await self._run_forked(claim, label, write_fd, tail)
            return await self._run_spawned(claim, label, write_fd, tail)
        finally:
            t_end = time.monotonic()
            try:
                await asyncio.wait_for(asyncio.shield(tail.closed), 0.5)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                pass
            log.debug("timing: %s tail_wait %.4f", label, time.monotonic() - t_end)
            transport.close()
            if log_file is not None:
                log_file.close()

    async def _run_forked(self, claim: Claim, label: str, write_fd: int, tail: _OutputTail) -> RunResult:
        assert self.zygote is not None
        env = self._agent_env(claim, self.zygote.supports_calc)
        started = time.monotonic()
        try:
            handle = await self.zygote.spawn_agent(env, write_fd)
            log.debug("timing: %s spawn %.4f", label, time.monotonic() - started)
        except ZygoteUnavailable as exc:
            return RunResult.failed(FailureReason.CRASH, detail=f"could not start the agent: {exc}")
        self.forked += 1
        self._live[handle.pid] = label
        log.info("started %s pid %d (forked)", label, handle.pid)
        timed_out = False
        try:
            try:
                ended = await asyncio.wait_for(handle.wait(), timeout=max(0.0, claim.deadline_s))
            except asyncio.TimeoutError:
                timed_out = True
                handle.kill()
                ended = await _bounded(handle.wait(), 10.0)
        except asyncio.CancelledError:
            handle.kill()
            await _bounded(handle.wait(), 5.0)
            raise
        finally:
            self._live.pop(handle.pid, None)
            kill_group(handle.pid)  # helpers left in the agent's group go with it
        wall = time.monotonic() - started
        if ended is not None:
            log.debug("timing: %s run_minus_agent %.4f", label, wall - ended.wall_s)
        if timed_out:
            return RunResult.failed(
                FailureReason.TIMEOUT,
                exit_code=None,
                agent_seconds=wall,
                detail=_detail(
                    tail.text(), f"deadline of {claim.deadline_s:g}s passed; killed the agent's process group"
                ),
            )
        if ended is None:
            return RunResult.failed(
                FailureReason.CRASH,
                agent_seconds=wall,
                detail=_detail(tail.text(), "the agent worker died while the agent was running"),
            )
        return self._result(ended, tail)

    async def _run_spawned(self, claim: Claim, label: str, write_fd: int, tail: _OutputTail) -> RunResult:
        env = dict(self.base_env)
        for name, value in self._agent_env(claim, False).items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        cmd = self.agent_cmd if self.sandbox is None else self.sandbox.command(self.agent_cmd, self.child_nice)
        started = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *cmd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=write_fd,
                stderr=write_fd,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            return RunResult.failed(
                FailureReason.CONFIG_ERROR, detail=f"cannot start the agent command {self.agent_cmd}: {exc}"
            )
        finally:
            os.close(write_fd)
        self.spawned += 1
        if self.child_nice and self.sandbox is None:  # a sealed agent sets its own, before it starts
            try:  # rollout work yields the CPU to orchestration (server, controller)
                os.setpriority(os.PRIO_PROCESS, proc.pid, self.child_nice)
            except OSError:
                pass
        self._live[proc.pid] = label
        log.info("started %s pid %d (spawned)", label, proc.pid)
        timed_out = False
        try:
            try:
                await asyncio.wait_for(proc.wait(), timeout=max(0.0, claim.deadline_s))
            except asyncio.TimeoutError:
                timed_out = True
                kill_group(proc.pid)
                await _bounded(proc.wait(), 10.0)
        except asyncio.CancelledError:
            kill_group(proc.pid)
            await _bounded(proc.wait(), 5.0)
            raise
        finally:
            self._live.pop(proc.pid, None)
            kill_group(proc.pid)
        wall = time.monotonic() - started
        if timed_out:
            return RunResult.failed(
                FailureReason.TIMEOUT,
                agent_seconds=wall,
                detail=_detail(
                    tail.text(), f"deadline of {claim.deadline_s:g}s passed; killed the agent's process group"
                ),
            )
        rc = proc.returncode if proc.returncode is not None else -signal.SIGKILL
        ended = ChildExit(code=rc if rc >= 0 else None, signal=-rc if rc < 0 else None, wall_s=wall, cpu_s=0.0)
        return self._result(ended, tail)

    def _result(self, ended: ChildExit, tail: _OutputTail) -> RunResult:
        text = tail.text()
        if ended.signal is not None:
            try:
                name = signal.Signals(ended.signal).name
            except ValueError:
                name = f"signal {ended.signal}"
            return RunResult.failed(
                FailureReason.CRASH,
                exit_code=-ended.signal,
                agent_seconds=ended.wall_s,
                detail=_detail(text, f"the agent was killed by {name}"),
            )
        code = ended.code or 0
        if code == 0:
            return RunResult.succeeded(exit_code=0, agent_seconds=ended.wall_s)
        reason = reason_from_agent_exit(code, text)
        return RunResult.failed(
            reason,
            exit_code=code,
            agent_seconds=ended.wall_s,
            detail=_detail(text, f"the agent exited with status {code}"),
        )


async def _bounded(aw: Any, timeout: float) -> Any:
    try:
        return await asyncio.wait_for(aw, timeout)
    except asyncio.TimeoutError:
        return None


def parse_command_option(value: str) -> list[str]:
    """A command given on the command line (`--agent-cmd`, `--worker-cmd`): a JSON list or a
    shell-like string."""
    value = value.strip()
    if value.startswith("["):
        cmd = json.loads(value)
        if not isinstance(cmd, list) or not cmd or not all(isinstance(c, str) for c in cmd):
            raise ValueError(f"command {value!r} must be a non-empty JSON list of strings")
        return cmd
    import shlex

    cmd = shlex.split(value)
    if not cmd:
        raise ValueError("the command is empty")
    return cmd
