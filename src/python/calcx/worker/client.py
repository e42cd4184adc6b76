"""Controller side of the pre-forked worker: start it, keep it alive, ask it for agent processes."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from calcx.contract.ready import WORKER_READY_LINE
from calcx.procs.procutil import kill_group, stop_group
from calcx.worker.protocol import WORKER_MODULE

log = logging.getLogger("calcx.worker.client")


class ZygoteUnavailable(RuntimeError):
    """The worker could not be started or reached; the caller may fall back to a plain spawn."""


def default_zygote_command(python: str | None = None) -> list[str]:
    return [python or sys.executable, "-m", WORKER_MODULE]


async def _read_line(reader: asyncio.StreamReader, timeout_s: float) -> bytes:
    """One line from the worker, or TimeoutError after `timeout_s`.

    Not ``asyncio.wait_for``: on Python 3.11 it returns the line when a cancel arrives in the
    same loop pass as the line, and the cancel is lost. A rollout cancelled while its agent was
    being forked then went on to wait for that agent to end by itself, and a controller's
    shutdown waited with it (up to the rollout's deadline).
    """
    async with asyncio.timeout(timeout_s):
        return await reader.readline()


@dataclass
class ChildExit:
    """How a forked agent ended, as the zygote saw it when reaping it."""

    code: int | None
    signal: int | None
    wall_s: float
    cpu_s: float


class AgentHandle:
    """One forked agent process: its pid, its exit, and a way to kill its process group."""

    def __init__(self, pid: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.pid = pid
        self._reader = reader
        self._writer = writer
        self._exit: asyncio.Future[ChildExit | None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        result: ChildExit | None = None
        try:
            while True:
                line = await self._reader.readline()
                if not line:
                    break
                msg = json.loads(line)
                if "exit" in msg:
                    info = msg["exit"]
                    result = ChildExit(
                        info.get("code"), info.get("signal"), float(info["wall_s"]), float(info["cpu_s"])
                    )
                    break
        except (OSError, ValueError, asyncio.IncompleteReadError):
            result = None
        finally:
            if not self._exit.done():
                self._exit.set_result(result)
            self._writer.close()

    async def wait(self) -> ChildExit | None:
        """The child's exit, or None when the zygote went away before reporting it."""
        return await asyncio.shield(self._exit)

    def kill(self) -> None:
        """SIGKILL the child's process group, through the zygote and directly."""
        if self._exit.done():
            return
        try:
            self._writer.write(b'{"op": "kill"}\n')
        except (OSError, RuntimeError):
            pass
        kill_group(self.pid)

    def close(self) -> None:
        self._task.cancel()
        self._writer.close()


class ZygoteClient:
    """One zygote process: started on demand, restarted when it dies."""

    def __init__(
        self,
        command: list[str],
        env: Mapping[str, str] | None = None,
        start_timeout_s: float = 120.0,
        log_path: str | None = None,
    ) -> None:
        self.command = list(command)
        self.env = dict(os.environ if env is None else env)
        self.start_timeout_s = start_timeout_s
        self.log_path = log_path
        self._dir = tempfile.mkdtemp(prefix="calcx-zygote-")
        self.sock_path = os.path.join(self._dir, "zygote.sock")
        self.proc: asyncio.subprocess.Process | None = None
        self.supports_calc = False
        self.restarts = 0
        self._lock = asyncio.Lock()
        self._closed = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def ensure(self) -> None:
        """Start the zygote if it is not running (again)."""
        if self.alive():
            return
        async with self._lock:
            if self.alive():
                return
            if self._closed:
                raise ZygoteUnavailable("the runner is closing")
            if self.proc is not None:
                self.restarts += 1
                log.warning(
                    "agent worker (pid %s) exited with %s; starting a new one", self.proc.pid, self.proc.returncode
                )
            await self._start()

    async def _start(self) -> None:
        t0 = time.perf_counter()
        stderr: Any = None
        if self.log_path:
            stderr = open(self.log_path, "ab")
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.command,
                "--socket",
                self.sock_path,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                env=self.env,
                start_new_session=True,
            )
        except OSError as exc:
            raise ZygoteUnavailable(f"cannot start the agent worker {self.command}: {exc}") from exc
        finally:
            if stderr is not None:
                stderr.close()
        assert self.proc.stdout is not None
        try:
            while True:
                line = await _read_line(self.proc.stdout, self.start_timeout_s)
                if not line:
                    raise ZygoteUnavailable(
                        f"the agent worker {self.command} exited with {await self.proc.wait()} before it was ready; "
                        "run it by hand to see why, or use --no-prefork"
                    )
                if line.decode(errors="replace").strip() == WORKER_READY_LINE:
                    break
        except asyncio.TimeoutError as exc:
            self._kill()
            raise ZygoteUnavailable(f"the agent worker was not ready after {self.start_timeout_s:.0f}s") from exc
        # The zygote writes nothing more on stdout; drain it anyway so it can never block.
        asyncio.create_task(self._drain(self.proc))
        pong = await self._request({"op": "ping"})
        self.supports_calc = bool(pong.get("calc"))
        log.info(
            "agent worker pid %s ready in %.2fs (calculator worker: %s)",
            self.proc.pid,
            time.perf_counter() - t0,
            self.supports_calc,
        )

    @staticmethod
    async def _drain(proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while await proc.stdout.read(4096):
            pass

    async def _connect(self) -> tuple[socket.socket, asyncio.StreamReader, asyncio.StreamWriter]:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, self.sock_path)
        except OSError:
            sock.close()
            raise
        return sock, *await asyncio.open_unix_connection(sock=sock)

    async def _request(self, msg: dict[str, Any]) -> dict[str, Any]:
        sock, reader, writer = await self._connect()
        try:
            writer.write((json.dumps(msg) + "\n").encode())
            line = await _read_line(reader, 10)
            return json.loads(line) if line else {}
        finally:
            writer.close()

    async def stats(self) -> dict[str, Any]:
        if not self.alive():
            return {}
        try:
            return await self._request({"op": "stats"})
        except OSError:
            return {}

    async def spawn_agent(self, env: Mapping[str, str | None], out_fd: int) -> AgentHandle:
        """Fork one agent with `env` (a None value unsets a variable), its stdout and stderr on
        `out_fd` (closed here)."""
        try:
            for attempt in range(2):
                await self.ensure()
                try:
                    sock, reader, writer = await self._connect()
                except OSError as exc:
                    if attempt == 0 and not self.alive():
                        continue
                    self._kill()
                    if attempt == 0:
                        continue
                    raise ZygoteUnavailable(f"cannot reach the agent worker: {exc}") from exc
                payload = (json.dumps({"op": "agent", "env": dict(env)}) + "\n").encode()
                try:
                    socket.send_fds(sock, [payload], [out_fd])
                    line = await _read_line(reader, 30)
                except (OSError, asyncio.TimeoutError) as exc:
                    writer.close()
                    if attempt == 0:
                        continue
                    raise ZygoteUnavailable(f"the agent worker did not answer: {exc!r}") from exc
                except asyncio.CancelledError:
                    writer.close()  # the worker kills an agent it forked for this request
                    raise
                msg = json.loads(line) if line else {"error": "the agent worker closed the connection"}
                if "pid" not in msg:
                    writer.close()
                    if attempt == 0 and not line:
                        continue
                    raise ZygoteUnavailable(f"the agent worker refused: {msg.get('error')}")
                return AgentHandle(int(msg["pid"]), reader, writer)
            raise ZygoteUnavailable("the agent worker is not available")
        finally:
            os.close(out_fd)

    def _kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            kill_group(self.proc.pid)

    async def close(self) -> None:
        """Stop the zygote: closing its stdin ends it and its children; SIGKILL if it lingers."""
        self._closed = True
        proc = self.proc
        if proc is not None and proc.returncode is None:
            if proc.stdin is not None:
                proc.stdin.close()
            await asyncio.to_thread(stop_group, proc.pid, grace_s=5.0, running=lambda: proc.returncode is None)
            await proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)
