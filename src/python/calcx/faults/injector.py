"""The fault injector: kills the agents and calculators that rows are planned to lose, and
restarts the server and the controller (and runs a second controller) at progress points."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calcx.faults.forensics import calculator_of_agent, kill_if_below, started_lines
from calcx.faults.plan import Plan
from calcx.procs.procutil import process_name, process_tree, survivors


@dataclass
class Event:
    kind: str
    at: float  # wall clock
    target: str = ""
    up_at: float | None = None  # when the restarted process was ready again
    note: str = ""


class Injector(threading.Thread):
    """Acts on the running stack: row-targeted kills, and process faults at progress points."""

    def __init__(
        self,
        stack: Any,
        plan: Plan,
        progress: Callable[[], float],
        schedule: list[tuple[float, str]],
        log: Callable[[str], None],
    ) -> None:
        super().__init__(name="fault-injector", daemon=True)
        self.stack = stack
        self.plan = plan
        self.progress = progress
        self.schedule = sorted(schedule)
        self.pending = list(self.schedule)
        self.log = log
        self.events: list[Event] = []
        self.errors: list[str] = []
        self._halt = threading.Event()
        self._done_kill: set[str] = set()
        self.orphans: list[str] = []

    def stop(self) -> None:
        self._halt.set()
        self.join(120)

    # -- row-targeted kills --------------------------------------------------------------
    def _controller_logs(self) -> list[Path]:
        return [p.log_path for p in self.stack.controllers]

    def _kill_targets(self) -> None:
        wanted = {"agent-killed-mid-rollout", "calculator-killed-mid-rollout"}
        for rid, aid, pid, log_name in started_lines(self._controller_logs()):
            kind = self.plan.kind.get(rid)
            if kind not in wanted or f"{rid}/{aid}" in self._done_kill:
                continue
            controller = next((c for c in self.stack.controllers if Path(c.log_path).name == log_name), None)
            if controller is None or not controller.alive():
                continue
            if kind == "agent-killed-mid-rollout":
                # the stub holds the model call for 3 s: the agent is certainly mid-rollout
                if kill_if_below(controller.pid, pid, "calcx-agent"):
                    self._done_kill.add(f"{rid}/{aid}")
                    self.events.append(Event("agent killed (SIGKILL)", time.time(), f"{rid}/{aid} pid {pid}"))
            else:
                # the stub holds the model call for 3 s: the agent has started its calculator and
                # waits for the model, then calls the calculator that is gone
                calc = calculator_of_agent(controller.pid, pid)
                if calc is None:
                    continue
                if kill_if_below(controller.pid, calc, "calcx-calc"):
                    self._done_kill.add(f"{rid}/{aid}")
                    self.events.append(
                        Event("calculator killed mid-rollout (SIGKILL)", time.time(), f"{rid}/{aid} pid {calc}")
                    )

    # -- process faults ------------------------------------------------------------------
    def _server_restart(self, sig: int) -> None:
        name = "SIGKILL" if sig == signal.SIGKILL else "SIGTERM"
        t0 = time.time()
        self.stack.server.stop(grace_s=10.0, sig=sig)
        deadline = time.monotonic() + 60
        while True:
            try:
                self.stack.start_server(30.0)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self.events.append(Event(f"server restarted ({name})", t0, "server", time.time()))

    def _controller_restart(self) -> None:
        c0 = self.stack.controllers[0]
        tree = process_tree([c0.pid])
        t0 = time.time()
        c0.stop(grace_s=0.1, sig=signal.SIGKILL)
        started = self.stack.start_controller(controller_id="faults-main", extra_args=self._extra)
        self.stack.controllers.remove(started)
        self.stack.controllers.insert(0, started)
        self.stack.controllers.append(c0)  # keep its log for the audit
        self.events.append(
            Event("controller restarted (SIGKILL)", t0, "faults-main", time.time(), note=f"new pid {started.pid}")
        )
        # what the killed controller had started (worker, agents, calculators) must be gone
        self.orphans += [f"{pid} {process_name(pid)}" for pid in survivors(tree)]

    _extra: list[str] = []

    def _second_controller(self, start: bool) -> None:
        t0 = time.time()
        if start:
            c = self.stack.start_controller(controller_id="faults-second", extra_args=self._extra)
            self._second = c
            self.events.append(Event("second controller started", t0, "faults-second", time.time()))
        else:
            c = getattr(self, "_second", None)
            if c is not None:
                c.stop(grace_s=20.0, sig=signal.SIGTERM)
                self.events.append(Event("second controller stopped (SIGTERM)", t0, "faults-second", time.time()))

    def server_down(self) -> list[tuple[float, float]]:
        """The (signal sent, ready again) wall-clock windows of the server's restarts."""
        return [(ev.at, ev.up_at) for ev in self.events if ev.target == "server" and ev.up_at is not None]

    def schedule_left(self) -> bool:
        return bool(self.pending) and self.is_alive()

    def busy(self) -> bool:
        return self.worker is not None and self.worker.is_alive()

    def _act(self, action: str) -> None:
        try:
            if action == "server-sigterm":
                self._server_restart(signal.SIGTERM)
            elif action == "server-sigkill":
                self._server_restart(signal.SIGKILL)
            elif action == "controller-restart":
                self._controller_restart()
            elif action == "second-controller-start":
                self._second_controller(True)
            elif action == "second-controller-stop":
                self._second_controller(False)
        except Exception as exc:  # keep going; the audit shows what happened
            self.errors.append(f"{action}: {type(exc).__name__}: {exc}")

    worker: threading.Thread | None = None

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self._kill_targets()
            except Exception as exc:
                self.errors.append(f"kill: {type(exc).__name__}: {exc}")
            if not self.busy() and self.pending and self.progress() >= self.pending[0][0]:
                _, action = self.pending.pop(0)
                self.log(f"fault: {action} at {self.progress():.0%}")
                self.worker = threading.Thread(target=self._act, args=(action,), name=f"fault-{action}", daemon=True)
                self.worker.start()
            self._halt.wait(0.05)
        if self.worker is not None:
            self.worker.join(90)
