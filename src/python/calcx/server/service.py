"""The rollout life cycle, apart from HTTP: creating and retrying rollouts, claims and their
leases, events and finishing, and the long polls that wait for those changes.

Every change a long poll waits for fires its signal right after the store commits it, and a
waiter checks the store and registers for the signal with no `await` in between
(calcx.server.signals), so a change is never missed. The routes (calcx.server.routes) read
requests and write answers; every change to a rollout or attempt goes through here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from calcx.api.models import (
    TERMINAL_STATES,
    CancelRequest,
    ClaimRequest,
    CreateRolloutsRequest,
    EventCreate,
    FinishRequest,
    HeartbeatRequest,
    reward_value,
)
from calcx.api.tokens import attempt_token
from calcx.contract.env import (
    AGL_EVENT_URL,
    AGL_KEY,
    AGL_OPENAI_BASE_URL,
    CALCX_ATTEMPT_ID,
    CALCX_ROLLOUT_ID,
    missing_row_field,
    rollout_env_map,
    row_env,
)
from calcx.contract.failures import FailureReason
from calcx.server.errors import APIError
from calcx.server.metrics import ServerMetrics
from calcx.server.settings import ServerSettings
from calcx.server.signals import Signals
from calcx.server.store import Conflict, RolloutStore

log = logging.getLogger("calcx.server")

_KNOWN_EVENT_TYPES = frozenset({"reward", "log", "tool_call", "answer", "error", "message"})


def _check_env_map(rollouts: CreateRolloutsRequest) -> None:
    for spec in rollouts.rollouts:
        missing = missing_row_field(spec.row, rollout_env_map(spec.env_map))
        if missing is not None:
            var, column = missing
            raise APIError(
                422,
                "invalid_body",
                f"rollout {spec.rollout_id!r}: env_map maps {var} to row field {column!r}, which the row does "
                f"not have (row fields: {sorted(spec.row)[:20]}); add the field or pass an env_map",
            )


def _refs(pairs: list[tuple[str, str]]) -> list[dict[str, str]]:
    return [{"rollout_id": r, "attempt_id": a} for r, a in pairs]


class RolloutService:
    """Owns the store between startup and shutdown, and the signals long polls sleep on."""

    def __init__(self, settings: ServerSettings, metrics: ServerMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.signals = Signals()
        self.store: RolloutStore | None = None
        self.closing = False

    @property
    def db(self) -> RolloutStore:
        if self.store is None:
            raise APIError(503, "starting", "the server is starting or stopping; try again shortly")
        return self.store

    @property
    def serving(self) -> bool:
        return self.store is not None and not self.closing

    # ---- startup and shutdown -------------------------------------------------------------

    def open(self, store: RolloutStore) -> None:
        """Start serving from `store`; attempts left RUNNING get a fresh lease."""
        lease_s = self.settings.lease_s
        renewed = store.attempts.renew_running_leases(lease_s)
        if renewed:
            log.warning(
                "%d attempt(s) were RUNNING when the server stopped; their controllers have %.0f s to "
                "heartbeat before they fail with reason controller_lost",
                renewed,
                lease_s,
            )
        leased = store.leases.renew_after_restart(self.settings.run_lease_s)
        if leased:
            log.warning(
                "%d run lease(s) were live when the server stopped; their trainers have %.0f s to renew them",
                leased,
                self.settings.run_lease_s,
            )
        self.store = store
        self.closing = False

    def begin_shutdown(self) -> None:
        """Answer every long poll now (called when the HTTP server starts shutting down)."""
        self.closing = True
        self.signals.fire_all()

    def close(self) -> None:
        self.store = None

    async def reap_leases(self) -> None:
        """Runs until cancelled: fail RUNNING attempts whose controller stopped heartbeating
        (reason controller_lost). Not once shutdown has begun: the server then takes no new
        connection, so no heartbeat can arrive, and a lapse would be the server's own doing (the
        next start gives every RUNNING attempt a fresh lease instead)."""
        interval = self.settings.lease_check_s
        while True:
            await asyncio.sleep(interval)
            store = self.store
            if store is None or self.closing:
                continue
            try:
                expired = store.attempts.expire_leases()
            except Exception:  # keep reaping; a transient SQLite error must not end the task
                log.exception("lease reaper failed")
                continue
            for item in expired:
                log.warning(
                    "attempt %s of rollout %s failed: controller %s lost (lease expired)",
                    item.attempt_id,
                    item.rollout_id,
                    item.controller_id,
                )
                self.metrics.finished.labels("FAILED", FailureReason.CONTROLLER_LOST).inc()
                self.signals.ended(item.rollout_id)
            if expired:
                self.signals.terminal.fire()

    async def prune(self) -> None:
        """Runs until cancelled: delete rollouts terminal for longer than `retain_s` (0: never)."""
        s = self.settings
        if s.retain_s <= 0:
            return
        while True:
            store = self.store
            if store is not None:
                try:
                    pruned = store.retention.prune(s.retain_s)
                except Exception:  # keep pruning; a transient SQLite error must not end the task
                    log.exception("retention failed")
                else:
                    if pruned:
                        log.info("retention: deleted %d rollouts terminal for more than %g s", pruned, s.retain_s)
                        self.metrics.pruned.inc(pruned)
            await asyncio.sleep(s.retain_check_s)

    # ---- rollouts -------------------------------------------------------------------------

    def rollout(self, rid: str) -> dict[str, Any]:
        rollout = self.db.rollouts.get(rid)
        if rollout is None:
            raise APIError(404, "not_found", f"no rollout {rid!r}")
        return rollout

    def create(self, request: CreateRolloutsRequest) -> list[dict[str, Any]]:
        _check_env_map(request)
        rollouts, created = self.db.rollouts.create(request.rollouts)
        if created:
            self.metrics.rollouts_created.inc(created)
            self.signals.queued.fire()
        return rollouts

    def retry(self, rid: str, force: bool = False) -> dict[str, Any]:
        self.db.attempts.retry(rid, force)
        self.metrics.retries.inc()
        self.signals.queued.fire()
        return self.rollout(rid)

    async def wait(self, rid: str, timeout_s: float) -> dict[str, Any]:
        """The rollout once its latest attempt is terminal, or as it is when the time is up."""
        deadline = time.monotonic() + self.settings.poll_timeout(timeout_s)
        while True:
            rollout = self.rollout(rid)
            remaining = deadline - time.monotonic()
            if rollout["state"] in TERMINAL_STATES or self.closing or remaining <= 0:
                return rollout
            await self.signals.rollout_terminal.wait(rid, remaining)

    async def terminal(self, after: int, limit: int, timeout_s: float) -> dict[str, Any]:
        """The next page of attempts that became terminal after cursor `after`; waits for one."""
        deadline = time.monotonic() + self.settings.poll_timeout(timeout_s)
        while True:
            found = self.db.attempts.terminal_after(after, limit)
            remaining = deadline - time.monotonic()
            if found or self.closing or remaining <= 0:
                break
            await self.signals.terminal.wait(remaining)
        rollouts = {r["rollout_id"]: r for r in self.db.rollouts.get_many([rid for _, rid, _ in found])}
        items = [
            {"cursor": cursor, "attempt_id": aid, "rollout": rollouts[rid]}
            for cursor, rid, aid in found
            if rid in rollouts
        ]
        return {"items": items, "next": found[-1][0] if found else after}

    # ---- controllers ----------------------------------------------------------------------

    async def claim(self, request: ClaimRequest, disconnected: Callable[[], Awaitable[bool]]) -> dict[str, Any]:
        """Up to `request.max` QUEUED rollouts, oldest first; waits for one when none is queued.
        Claims made for a claimer that `disconnected` during the wait go back to the queue."""
        lease_s = self.settings.lease_s
        deadline = time.monotonic() + self.settings.poll_timeout(request.timeout_s)
        waited = False
        while True:
            picked = self.db.attempts.claim(request.controller_id, request.max, lease_s)
            remaining = deadline - time.monotonic()
            if picked or self.closing or remaining <= 0:
                break
            await self.signals.queued.wait(remaining)
            waited = True
        if picked and waited and await disconnected():
            # The controller gave up on this long poll (its own timeout): nobody would run these.
            self.db.attempts.unclaim(request.controller_id, picked)
            self.signals.queued.fire()
            log.info(
                "claimer %s disconnected during its long poll; %d claim(s) requeued", request.controller_id, len(picked)
            )
            return {"claims": [], "lease_s": lease_s}
        claims = []
        if picked:
            self.metrics.claims.inc(len(picked))
            rollouts = {r["rollout_id"]: r for r in self.db.rollouts.get_many([rid for rid, _ in picked])}
            claims = [self._claim(rollouts[rid], aid) for rid, aid in picked]
        return {"claims": claims, "lease_s": lease_s}

    def _claim(self, rollout: dict[str, Any], attempt_id: str) -> dict[str, Any]:
        """A claim: the rollout, its attempt token and the agent's whole environment."""
        settings = self.settings
        rid = rollout["rollout_id"]
        nonce = self.db.attempts.token_nonce(rid, attempt_id)
        assert nonce is not None, "a claimed attempt has its token nonce"
        token = attempt_token(settings.key, rid, attempt_id, nonce)
        row = rollout["row"]
        env = row_env(row, rollout_env_map(rollout.get("env_map")))
        prefix = f"{settings.public_url}/v1/rollouts/{rid}/attempts/{attempt_id}"
        env.update(
            {
                AGL_OPENAI_BASE_URL: f"{prefix}/v1",
                AGL_EVENT_URL: f"{prefix}/events",
                AGL_KEY: token,
                CALCX_ROLLOUT_ID: rid,
                CALCX_ATTEMPT_ID: attempt_id,
            }
        )
        return {
            "rollout": rollout,
            "attempt_id": attempt_id,
            "token": token,
            "env": env,
            "deadline_s": rollout["deadline_s"],
        }

    def heartbeat(self, request: HeartbeatRequest) -> dict[str, Any]:
        refs = None if request.attempts is None else [(a.rollout_id, a.attempt_id) for a in request.attempts]
        lease_s = self.settings.lease_s
        held, lost = self.db.attempts.heartbeat(request.controller_id, refs, lease_s)
        return {
            "lease_s": lease_s,
            "held": _refs(held),
            "lost": [{"rollout_id": r, "attempt_id": a, "reason": reason} for r, a, reason in lost],
        }

    def finish(self, rid: str, aid: str, request: FinishRequest) -> dict[str, Any]:
        if request.state == "SUCCEEDED" and request.reason is not None:
            raise APIError(422, "invalid_body", "a SUCCEEDED attempt has no failure reason; send reason: null")
        if request.state == "FAILED" and request.reason is None:
            raise APIError(422, "invalid_body", "a FAILED attempt needs a reason (e.g. crash, timeout)")
        self.db.attempts.finish(
            rid, aid, request.state, request.reason, request.exit_code, request.agent_seconds, request.detail
        )
        self.metrics.finished.labels(request.state, request.reason or "").inc()
        self.signals.ended(rid)
        self.signals.terminal.fire()
        return self.rollout(rid)

    def cancel(self, request: CancelRequest) -> dict[str, Any]:
        """FAIL (reason cancelled_by_api) the QUEUED and RUNNING attempts of a run or of given
        rollouts. A cancelled RUNNING attempt is lost to its controller, whose next heartbeat stops
        it; the rollout is retried only when forced."""
        detail = request.detail or (
            f"cancelled with run {request.run!r}" if request.run is not None else "cancelled by rollout id"
        )
        cancelled = self.db.attempts.cancel(request.run, request.rollout_ids, detail, request.owner)
        for rid, _ in cancelled:
            self.metrics.finished.labels("FAILED", FailureReason.CANCELLED_BY_API).inc()
            self.signals.ended(rid)
        if cancelled:
            self.signals.terminal.fire()
            log.warning("cancelled %d attempt(s): %s", len(cancelled), detail)
        return {"cancelled": _refs(cancelled)}

    def fail(self, rid: str, aid: str, reason: FailureReason, detail: str) -> bool:
        """The server's own verdict on a RUNNING attempt: FAILED with an infrastructure `reason`
        (so the trainer retries it, never trains it). False when it was no longer RUNNING."""
        try:
            self.db.attempts.finish(rid, aid, "FAILED", reason, None, None, detail)
        except Conflict:
            return False
        self.metrics.finished.labels("FAILED", reason).inc()
        self.signals.ended(rid)
        self.signals.terminal.fire()
        return True

    # ---- agents ---------------------------------------------------------------------------

    def add_event(self, rid: str, aid: str, event: EventCreate) -> int:
        """Store an event; a reward needs a finite `data.value` within the settings' reward range
        and becomes the rollout's reward."""
        reward = None
        if event.event_type == "reward":
            try:
                reward = reward_value(event.data)
            except ValueError as exc:
                raise APIError(422, "invalid_reward", str(exc)) from None
            low, high = self.settings.reward_min, self.settings.reward_max
            if not low <= reward <= high:
                raise APIError(
                    422,
                    "invalid_reward",
                    f"data.value {reward:g} is outside the reward range "
                    f"[{low:g}, {high:g}] this server accepts (calcx server --reward-min/--reward-max)",
                )
        s = self.settings
        event_id = self.db.events.add(
            rid,
            aid,
            event.event_type,
            event.data,
            reward,
            max_count=s.max_events_per_attempt,
            max_bytes=s.max_event_bytes_per_attempt,
        )
        kind = event.event_type if event.event_type in _KNOWN_EVENT_TYPES else "other"
        self.metrics.events.labels(kind).inc()
        return event_id
