"""Helpers for the agent tests: an event receiver app, agent processes in their own process groups."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

SRC = Path(__file__).resolve().parents[2] / "src" / "python"

# Word problems the stub cannot solve from the text alone: it needs the scripted expression.
SCRIPTED = {
    "Mia packs 7 boxes with 12 pencils each and then adds 5 loose pencils. How many pencils does she have?": (
        "7 * 12 + 5",
        "89",
    ),
    "A tank holds 90 liters. Two thirds of it is drained. How many liters remain?": ("90 * (1 - 2/3)", "30"),
}


@dataclass
class EventLog:
    """What the event receiver got: (path, authorization header, JSON body)."""

    events: list[tuple[str, str | None, dict]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def for_path(self, path: str) -> list[tuple[str | None, dict]]:
        with self.lock:
            return [(auth, body) for p, auth, body in self.events if p == path]


def event_receiver_app(log: EventLog) -> FastAPI:
    """Accepts rewards at /ok/<name>; /reject/<name> answers 401, /broken/<name> 500."""
    app = FastAPI()

    @app.post("/{kind}/{name}")
    async def receive(kind: str, name: str, request: Request) -> JSONResponse:
        body = await request.json()
        with log.lock:
            log.events.append((f"/{kind}/{name}", request.headers.get("authorization"), body))
        if kind == "reject":
            return JSONResponse({"error": {"code": "unauthorized", "message": "bad token"}}, status_code=401)
        if kind == "broken":
            return JSONResponse({"error": {"code": "internal", "message": "broken"}}, status_code=500)
        return JSONResponse({"event_id": str(len(log.events))})

    return app


def closed_port() -> int:
    """A loopback port that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def agent_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGL_", "CALCX_"))}
    env.pop("QUESTION", None)
    env.pop("RESULT", None)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(overrides)
    return env


@dataclass
class AgentRun:
    """A running agent process (its own process group, so that cleanup reaches its calculator)."""

    name: str
    proc: subprocess.Popen
    started: float
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0

    def wait(self, timeout_s: float) -> AgentRun:
        try:
            out, err = self.proc.communicate(timeout=max(0.1, timeout_s))
        except subprocess.TimeoutExpired:
            kill_group(self.proc)
            out, err = self.proc.communicate(timeout=10)
            raise AssertionError(f"agent run {self.name!r} did not finish in time; stderr:\n{err[-3000:]}") from None
        self.returncode, self.stdout, self.stderr = self.proc.returncode, out, err
        self.seconds = time.monotonic() - self.started
        return self

    def end(self) -> None:
        """Kill the agent's process group if it still runs (a test's cleanup; a no-op after ``wait``)."""
        if self.proc.poll() is None:
            kill_group(self.proc)
            self.proc.wait(10)

    @property
    def last_stderr_line(self) -> str:
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        return lines[-1] if lines else ""


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def start_agent(name: str, env: dict[str, str], argv: list[str] | None = None) -> AgentRun:
    proc = subprocess.Popen(
        argv or [sys.executable, "-m", "calcx.agent"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    return AgentRun(name=name, proc=proc, started=time.monotonic())
