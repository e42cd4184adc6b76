"""The claim loop: long-poll the server for queued rollouts, run each through a runner, report.

One claim request is in flight at a time and asks for as many rollouts as there are free slots,
so the controller never holds a claim it cannot start. A slot that frees up wakes the loop at
once (no polling sleep). Leases are kept alive by a heartbeat; an attempt the server says is lost
is killed. The terminal state goes to ``/finish`` as soon as the runner returns, retried through
server restarts.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from calcx.api.client import AsyncCalcxClient, CalcxAPIError
from calcx.api.models import Claim, LostAttempt
from calcx.contract.failures import FailureReason
from calcx.controller.attempts import AttemptKey, Attempts, RunsEndedView, TasksView
from calcx.controller.base import Runner, RunResult
from calcx.controller.concurrency import default_concurrency

log = logging.getLogger("calcx.controller")

DETAIL_LIMIT = 60_000
#: How often the heartbeat loop re-reads the lease; bounds the delay after a shorter lease arrives.
HEARTBEAT_TICK_S = 0.2
MIN_HEARTBEAT_SLEEP_S = 0.01
#: A cancelled rollout ends in well under a second; one still running after this is named in the log.
CANCEL_WARN_S = 10.0
#: How long a stopping controller waits on the server for one thing: a report (an attempt's
#: cancel or result), the question which attempts it holds, the reports of those it never ran.
#: Past it, what is left ends when its lease lapses.
STOP_TIMEOUT_S = 5.0


def default_controller_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass
class ControllerStats:
    """What became of the attempts this controller claimed. `finished` counts them by end
    ("SUCCEEDED", "FAILED:<reason>"), cancelled ones too (at shutdown, or through the cancel API);
    `lost`: those the server took back for another reason (a lapsed lease)."""

    claimed: int = 0
    finished: dict[str, int] = field(default_factory=dict)
    report_failures: int = 0
    lost: int = 0

    def count(self, result: RunResult) -> None:
        key = result.state if result.state == "SUCCEEDED" else f"FAILED:{result.reason}"
        self.finished[key] = self.finished.get(key, 0) + 1


class Controller:
    """Claims and runs rollouts until :meth:`stop` (or ``max_rollouts`` is reached)."""

    def __init__(
        self,
        server_url: str,
        key: str,
        runner: Runner,
        *,
        concurrency: int | None = None,
        controller_id: str | None = None,
        claim_timeout_s: float = 10.0,
        max_rollouts: int | None = None,
        shutdown_grace_s: float = 0.0,
        report_timeout_s: float = 120.0,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        if concurrency is None:
            concurrency = default_concurrency()
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.server_url = server_url.rstrip("/")
        self.key = key
        self.runner = runner
        self.concurrency = concurrency
        self.controller_id = controller_id or default_controller_id()
        self.claim_timeout_s = claim_timeout_s
        self.max_rollouts = max_rollouts
        self.shutdown_grace_s = shutdown_grace_s
        self.report_timeout_s = report_timeout_s
        self.on_ready = on_ready
        self.stats = ControllerStats()
        self.lease_s = 30.0
        self._client: AsyncCalcxClient | None = None
        self.attempts = Attempts()  # what became of each attempt held, and the rules of it
        self._slot_freed = asyncio.Event()
        self._stop = asyncio.Event()
        self._claim_task: asyncio.Task[Any] | None = None
        self._stopped_at: float | None = None

    # -- public --------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop claiming; :meth:`run` then ends what is running and returns."""
        if self._stopped_at is None:
            self._stopped_at = time.monotonic()
            log.info("stopping: no more claims; %d rollouts running", len(self._running))
        self._stop.set()
        self._slot_freed.set()
        if self._claim_task is not None and not self._claim_task.done():
            self._claim_task.cancel()
            self.attempts.claim_cancelled()

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def _running(self) -> TasksView:
        """The attempts that run in a task, by key (a view of the ledger; assigning launches)."""
        return self.attempts.tasks

    @property
    def _reporting(self) -> RunsEndedView:
        """The attempts whose run has ended (a view of the ledger; ``add`` begins a report)."""
        return self.attempts.runs_ended

    async def run(self) -> None:
        self._client = AsyncCalcxClient(self.server_url, self.key, max_connections=self.concurrency + 8)
        await self.runner.start()
        if self.on_ready is not None:
            self.on_ready()
        heartbeat = asyncio.create_task(self._heartbeat_loop(), name="calcx-heartbeat")
        try:
            await self._claim_loop()
        finally:
            try:
                # the leases of what still runs stay alive through the grace period and the
                # runners' stops, until each attempt is reported: it ends with its own result or
                # cancelled, never lost
                await self._shutdown()
            finally:
                heartbeat.cancel()
                await asyncio.gather(heartbeat, return_exceptions=True)
            await self.runner.close()
            await self._client.aclose()
            if self._stopped_at is not None:
                log.info("stopped %.2fs after the stop request", time.monotonic() - self._stopped_at)

    # -- claiming ------------------------------------------------------------------------
    async def _claim_loop(self) -> None:
        backoff = 0.05
        while not self._stop.is_set():
            if self.max_rollouts is not None and self.stats.claimed >= self.max_rollouts:
                break
            free = self.concurrency - len(self._running)
            if free <= 0:
                self._slot_freed.clear()
                await self._slot_freed.wait()
                continue
            if self.max_rollouts is not None:
                free = min(free, self.max_rollouts - self.stats.claimed)
            assert self._client is not None
            self._claim_task = asyncio.create_task(
                self._client.claim(self.controller_id, max=free, timeout_s=self.claim_timeout_s)
            )
            try:
                answer = await self._claim_task
            except asyncio.CancelledError:
                if self._stop.is_set():
                    break
                raise
            except CalcxAPIError as exc:
                if exc.unreachable or exc.status >= 500:
                    log.warning("claim failed (%s); retrying in %.2fs", exc, backoff)
                else:
                    log.error("the server refused the claim request: %s", exc)
                await self._sleep_or_stop(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            finally:
                self._claim_task = None
            if self._stop.is_set():  # stopped as the answer came in: start none of it (see _release_unrun)
                self.attempts.hold_unrun((c.rollout.rollout_id, c.attempt_id) for c in answer.claims)
                break
            backoff = 0.05
            self.lease_s = answer.lease_s or self.lease_s
            for claim in answer.claims:
                self._launch(claim)

    def _launch(self, claim: Claim) -> None:
        key = (claim.rollout.rollout_id, claim.attempt_id)
        self.stats.claimed += 1
        task = asyncio.create_task(self._run_one(claim), name=f"calcx-rollout-{key[0]}/{key[1]}")
        self.attempts.launch(key, task)

        def done(_: asyncio.Task[None]) -> None:
            self.attempts.task_done(key)
            self._slot_freed.set()

        task.add_done_callback(done)

    async def _run_one(self, claim: Claim) -> None:
        rid, aid = claim.rollout.rollout_id, claim.attempt_id
        t0 = time.monotonic()
        try:
            result = await self.runner.run(claim)
            log.debug("timing: %s/%s run %.4f", rid, aid, time.monotonic() - t0)
        except asyncio.CancelledError:
            # a stop's cancel reports the attempt; one the server took back is no longer ours to report
            if self._stop.is_set() and self.attempts.stop_reports((rid, aid)):
                result = RunResult.failed(FailureReason.CANCELLED, detail=f"controller {self.controller_id} shut down")
                self.attempts.begin_report((rid, aid))  # a heartbeat crossing this report must not cancel it
                try:
                    await self._report(rid, aid, result, timeout_s=STOP_TIMEOUT_S)
                finally:
                    self.attempts.end_report((rid, aid))
            raise
        except Exception as exc:  # a runner bug must not lose the rollout
            log.exception("runner failed on %s/%s", rid, aid)
            result = RunResult.failed(FailureReason.CRASH, detail=f"runner error: {type(exc).__name__}: {exc}")
        t1 = time.monotonic()
        self.attempts.begin_report((rid, aid))
        try:
            # a runner that returned after a stop's cancel reports within the stop's bound too
            await self._report(
                rid, aid, result, timeout_s=STOP_TIMEOUT_S if self._stop.is_set() else self.report_timeout_s
            )
        except asyncio.CancelledError:  # a stop gave up on this report (CANCEL_WARN_S): the lease ends it
            self.stats.report_failures += 1
            self._note_unreported((rid, aid))
            raise
        finally:
            self.attempts.end_report((rid, aid))
        log.debug("timing: %s/%s report %.4f", rid, aid, time.monotonic() - t1)

    async def _report(self, rid: str, aid: str, result: RunResult, timeout_s: float) -> None:
        assert self._client is not None
        self.stats.count(result)
        detail = result.detail[-DETAIL_LIMIT:] if result.detail else None
        deadline = time.monotonic() + timeout_s
        backoff = 0.05
        while True:
            try:
                await self._client.finish(
                    rid,
                    aid,
                    result.state,
                    reason=result.reason,
                    exit_code=result.exit_code,
                    agent_seconds=result.agent_seconds,
                    detail=detail,
                )
                log.info("finished %s/%s %s%s", rid, aid, result.state, f" ({result.reason})" if result.reason else "")
                return
            except CalcxAPIError as exc:
                retriable = exc.unreachable or exc.status >= 500
                if not retriable:
                    # 409: no longer RUNNING (lease expired, already finished); 404: gone. Any
                    # other refusal leaves the attempt RUNNING there until its lease lapses.
                    log.warning("server did not take the result of %s/%s: %s", rid, aid, exc)
                    self.stats.report_failures += 1
                    if exc.status not in (404, 409):
                        self._note_unreported((rid, aid))
                    return
                if time.monotonic() + backoff > deadline:
                    log.error("gave up reporting %s/%s after %.0fs: %s", rid, aid, timeout_s, exc)
                    self.stats.report_failures += 1
                    self._note_unreported((rid, aid))
                    return
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    # -- leases --------------------------------------------------------------------------
    async def _heartbeat_loop(self) -> None:
        """Heartbeat what is running once lease/3 has passed since the last heartbeat.

        The lease is the one in the latest claim (or heartbeat) answer, re-read on every wake-up
        (at most every HEARTBEAT_TICK_S), so attempts claimed under a lease shorter than the
        controller's initial guess are renewed in time from the first claim on.
        """
        assert self._client is not None
        last = time.monotonic()
        while True:
            due = last + self.lease_s / 3
            await asyncio.sleep(min(HEARTBEAT_TICK_S, max(due - time.monotonic(), MIN_HEARTBEAT_SLEEP_S)))
            if time.monotonic() < last + self.lease_s / 3 or not self._running:
                continue
            last = time.monotonic()
            refs = list(self._running)
            try:
                answer = await self._client.heartbeat(self.controller_id, refs)
            except CalcxAPIError as exc:
                log.warning("heartbeat failed: %s", exc)
                continue
            self.lease_s = answer.lease_s or self.lease_s
            self._stop_lost(answer.lost)

    def _stop_lost(self, lost: Iterable[LostAttempt]) -> None:
        """Stop what the server no longer counts as ours, except attempts whose result is being
        reported: a heartbeat that crossed their finish sees them terminal, and nothing is lost.
        One the server failed as cancelled is counted as cancelled, not lost."""
        for ref in lost:
            key = (ref.rollout_id, ref.attempt_id)
            task = self._running.get(key)
            if task is None or task.done():  # ended and reported; its done callback is yet to run
                continue
            if not self.attempts.take_back(key):
                log.debug("%s/%s finished while a heartbeat was in flight", *key)
                continue
            if ref.reason in (FailureReason.CANCELLED, FailureReason.CANCELLED_BY_API):
                log.warning("%s/%s was cancelled; stopping it", *key)
                self.stats.count(RunResult.failed(FailureReason(ref.reason)))
            else:
                log.warning("server says %s/%s is no longer ours; stopping it", *key)
                self.stats.lost += 1
            task.cancel()

    # -- shutdown ------------------------------------------------------------------------
    def _note_unreported(self, key: AttemptKey) -> None:
        """Remember an attempt the server may still hold for us although it ran here; past the
        ledger's bound the oldest is forgotten (then a release may end it as never run)."""
        forgotten = self.attempts.report_not_taken(key)
        if forgotten is not None:
            log.warning(
                "more than %d attempts left unreported; forgetting %s/%s", self.attempts.max_unreported, *forgotten
            )

    async def _release_unrun(self, known: frozenset[AttemptKey]) -> None:
        """End as cancelled the attempts the server counts as this controller's that it never ran.

        A claim answer read after a stop names its attempts, which were never started. A claim
        request that a stop cancels may have been answered already: the server then holds attempts
        RUNNING for this controller that nobody runs, until their lease lapses (reason
        controller_lost); a heartbeat without a list names every attempt the server counts as
        ours, and `known` (taken before asking) holds those this process ran or is running, so one
        that ends meanwhile is not reported twice. An attempt an earlier process under the same id
        left is not ours to know apart, and ends cancelled too. Bounded by STOP_TIMEOUT_S twice.
        """
        try:
            if self.attempts.claims_unread:
                self.attempts.hold_unrun(await self._held_unrun(known))
            await self._end_unrun(self.attempts.unrun())
        except Exception:  # the stop goes on whatever happens here; the lease is the fallback
            log.exception("releasing the attempts this controller never ran failed")

    async def _held_unrun(self, known: frozenset[AttemptKey]) -> list[AttemptKey]:
        assert self._client is not None
        try:
            answer = await asyncio.wait_for(self._client.heartbeat(self.controller_id), STOP_TIMEOUT_S)
        except (CalcxAPIError, asyncio.TimeoutError) as exc:
            log.warning(
                "could not ask the server which attempts it counts as ours (%s); an attempt claimed "
                "as the controller stopped ends when its lease lapses",
                str(exc) or type(exc).__name__,
            )
            return []
        return [
            (ref.rollout_id, ref.attempt_id) for ref in answer.held if (ref.rollout_id, ref.attempt_id) not in known
        ]

    async def _end_unrun(self, unrun: list[AttemptKey]) -> None:
        if not unrun:
            return
        detail = (
            f"controller {self.controller_id} held this attempt but never ran it "
            "(claimed as it stopped, or by an earlier controller under the same id)"
        )
        reports = []
        for rid, aid in unrun:
            log.warning("%s/%s is held for this controller, which never ran it; ending it cancelled", rid, aid)
            self.stats.claimed += 1
            result = RunResult.failed(FailureReason.CANCELLED, detail=detail)
            reports.append(asyncio.create_task(self._report(rid, aid, result, timeout_s=STOP_TIMEOUT_S)))
        _, pending = await asyncio.wait(reports, timeout=STOP_TIMEOUT_S)
        for task in pending:
            task.cancel()
        await asyncio.gather(*reports, return_exceptions=True)
        if pending:
            self.stats.report_failures += len(pending)
            log.warning(
                "%d of those reports did not finish in %.0fs; they end when their lease lapses",
                len(pending),
                STOP_TIMEOUT_S,
            )

    async def _sleep_or_stop(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._stop.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    async def _shutdown(self) -> None:
        """After a stop: grace, then cancel (each reports FAILED cancelled), and beside that, if
        the stop cancelled a claim, release what it may have taken. Otherwise drain."""
        release = None
        if self.attempts.must_release():
            release = asyncio.create_task(self._release_unrun(self.attempts.known()), name="calcx-release")
        try:
            await self._end_running()
        finally:
            if release is not None:
                await release

    async def _end_running(self) -> None:
        stop_waiter = asyncio.create_task(self._stop.wait())
        try:
            while self._running and not self._stop.is_set():
                await asyncio.wait([*self._running.values(), stop_waiter], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop_waiter.cancel()
        tasks = list(self._running.values())
        if not tasks:
            return
        if self.shutdown_grace_s > 0:
            log.info("waiting up to %.0fs for %d running rollouts", self.shutdown_grace_s, len(tasks))
            await asyncio.wait(tasks, timeout=self.shutdown_grace_s)
        # one whose run has ended is reporting its own result: let it, within CANCEL_WARN_S
        for key, task in list(self._running.items()):
            if not self.attempts.run_ended(key):
                task.cancel()
        _, pending = await asyncio.wait(tasks, timeout=CANCEL_WARN_S)
        if pending:  # a runner that lost the cancel: the agent runs on to its end or deadline
            log.warning(
                "%d cancelled rollouts still running after %.0fs: %s",
                len(pending),
                CANCEL_WARN_S,
                ", ".join(sorted(t.get_name() for t in pending)),
            )
            for key, task in list(self._running.items()):
                if self.attempts.run_ended(key):  # a report that long: its attempt ends when its lease lapses
                    task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
