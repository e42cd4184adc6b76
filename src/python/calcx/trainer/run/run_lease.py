"""The run's lease on the calcx server: one trainer process at a time per run name.

`calcx train` takes the lease before it touches anything of its run (the resume plan, the
previous run's leftovers, the training ledger), renews it from a thread while it runs and releases
it when it ends. A second start of a run whose lease is live waits up to `wait_s` for it to lapse
(a killed trainer's lapses within one lease length; a live one keeps renewing), then is refused
with the server's message, unless it takes the run over. Every ledger record, rewind and cancel
of the run names this process's owner id, so a trainer that was taken over is refused by the
server; its keeper notices at its next renewal and stops it.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from calcx.api.client import CalcxAPIError, CalcxClient
from calcx.api.errors import LEASE_LOST, RUN_LEASED
from calcx.api.models import RunLease

log = logging.getLogger(__name__)

#: how long a second start waits for a held lease to lapse (the server's default lease is 30 s)
DEFAULT_WAIT_S = 40.0
POLL_S = 2.0


class RunLeaseRefused(RuntimeError):
    """Another trainer holds the run; the message names it and says what to do."""


def new_owner() -> str:
    """An owner id for this trainer process: readable (host, pid) and never reused (random tail)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


def take_run_lease(
    client: CalcxClient,
    run: str,
    owner: str,
    *,
    take_over: bool = False,
    wait_s: float = DEFAULT_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
) -> RunLease:
    """The run's lease for `owner`, or RunLeaseRefused after waiting up to `wait_s` for a held one
    to lapse."""
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            lease = client.acquire_lease(run, owner, take_over)
        except CalcxAPIError as exc:
            if exc.code != RUN_LEASED:
                raise
            left = deadline - time.monotonic()
            if left <= 0:
                raise RunLeaseRefused(f"{exc.message} (waited {wait_s:.0f} s)") from None
            if not said:
                print(
                    f"calcx train: {exc.message}; waiting up to {wait_s:.0f} s for that lease to lapse "
                    "(a stopped trainer's does)",
                    flush=True,
                )
                said = True
            sleep(min(POLL_S, left))
            continue
        if lease.took_over:
            log.warning(
                "calcx train: took run %r over from trainer %r, whose writes for it are refused from now on",
                run,
                lease.previous_owner,
            )
        return lease


@dataclass
class LeaseKeeper:
    """Renews `lease` every third of its length from a daemon thread. A renewal the server refuses
    (another trainer took the run) ends the keeper and calls `on_lost` with the server's message;
    an unreachable server is tried again at the next tick."""

    client: CalcxClient
    lease: RunLease
    on_lost: Callable[[str], None]
    lost: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> LeaseKeeper:
        self._thread = threading.Thread(target=self._run, name="calcx-run-lease", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(max(0.05, self.lease.lease_s / 3)):
            try:
                self.lease = self.client.renew_lease(self.lease.run, self.lease.owner)
            except CalcxAPIError as exc:
                if exc.code == LEASE_LOST:
                    self.lost = exc.message
                    log.error("calcx train: this trainer no longer holds run %r: %s", self.lease.run, exc.message)
                    self.on_lost(exc.message)
                    return
                log.warning("calcx train: renewing run %r's lease failed (%s); trying again", self.lease.run, exc)

    def stop(self, release: bool = True) -> None:
        """Stop renewing and, unless the lease was lost, release it (the next start needs no wait)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if release and self.lost is None:
            try:
                self.client.release_lease(self.lease.run, self.lease.owner)
            except CalcxAPIError as exc:
                log.warning(
                    "calcx train: releasing run %r's lease failed (%s); it lapses by itself", self.lease.run, exc
                )
