"""What a fault run promises, checked against the store: nothing lost, nothing run twice, every
failure with its reason, rewards kept, planned faults ending as planned, hostile text intact;
and how long the service took to recover after each restart."""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from calcx.faults.injector import Event
from calcx.faults.plan import COLLATERAL_REASONS, PLANNED, RETRIABLE_KINDS, decisive_attempt


def all_rollouts(client: Any, prefix: str | None = None) -> list[Any]:
    out, offset = [], 0
    while True:
        page = client.list_rollouts(limit=1000, offset=offset)
        out.extend(page)
        if len(page) < 1000:
            break
        offset += 1000
    return [r for r in out if prefix is None or r.rollout_id.startswith(prefix + "-")]


def audit(
    rollouts: list[Any],
    kind_of: dict[str, str],
    starts: list[tuple[str, str, int, str]],
    posted: dict[tuple[str, str], float],
    questions: dict[str, str] | None = None,
    calls: Callable[[str, str], list[Any]] | None = None,
) -> dict[str, Any]:
    """Everything the run promises, checked against the store."""
    by_id = {r.rollout_id: r for r in rollouts}
    lost = sorted(set(kind_of) - set(by_id)) + sorted(
        r.rollout_id for r in rollouts if r.rollout_id in kind_of and not r.is_terminal
    )
    start_count = Counter((rid, aid) for rid, aid, _, _ in starts)
    duplicates = sorted(f"{rid}/{aid} x{n}" for (rid, aid), n in start_count.items() if n > 1)
    failed_without_reason, succeeded_without_reward, reward_mismatch = [], [], []
    unexpected: list[str] = []
    masked: list[str] = []
    reasons: Counter[str] = Counter()
    planned_outcomes: dict[str, Counter[str]] = defaultdict(Counter)
    attempts_total = 0
    for r in rollouts:
        if r.rollout_id not in kind_of:
            continue
        for a in r.attempts:
            attempts_total += 1
            if a.state == "FAILED":
                reasons[a.reason or "<none>"] += 1
                if not a.reason:
                    failed_without_reason.append(f"{r.rollout_id}/{a.attempt_id}")
            key = (r.rollout_id, a.attempt_id)
            if key in posted:
                stored = [
                    e.data.get("value") for e in r.events if e.attempt_id == a.attempt_id and e.event_type == "reward"
                ]
                if not stored or stored[-1] != posted[key]:
                    reward_mismatch.append(f"{r.rollout_id}/{a.attempt_id}: agent posted {posted[key]}, store {stored}")
        if r.state == "SUCCEEDED" and r.reward is None:
            succeeded_without_reward.append(r.rollout_id)
        kind = kind_of[r.rollout_id]
        # rows that should succeed are judged by their last attempt (retried after collateral
        # failures); planned faults by the first attempt no process fault cut short
        first = r.attempts[-1] if kind in RETRIABLE_KINDS else decisive_attempt(r)
        outcome = first.state if first.state != "FAILED" else f"FAILED {first.reason}"
        planned_outcomes[kind][outcome] += 1
        if kind in PLANNED:
            want_state, want_reason = PLANNED[kind][1]
            if first.state == "FAILED" and first.reason in COLLATERAL_REASONS:
                masked.append(f"{r.rollout_id}: every attempt ended {first.reason}")
            elif first.state != want_state or (want_reason not in (None, "*") and first.reason != want_reason):
                unexpected.append(
                    f"{r.rollout_id}: attempt {first.attempt_id} {outcome}, planned {want_state} "
                    f"{want_reason or ''}"
                )
            if want_state == "FAILED" and first.state == "SUCCEEDED":
                unexpected.append(f"{r.rollout_id}: infrastructure fault ended SUCCEEDED reward {r.reward}")
            if kind.startswith("answer-") and first.state == "SUCCEEDED" and r.reward != 0.0:
                unexpected.append(f"{r.rollout_id}: hostile answer scored {r.reward}")
    not_started = [
        f"{r.rollout_id}/{a.attempt_id}"
        for r in rollouts
        if r.rollout_id in kind_of
        for a in r.attempts
        if a.state == "SUCCEEDED" and start_count[(r.rollout_id, a.attempt_id)] == 0
    ]
    text_mismatch: list[str] = []
    from calcx.agent.answer import build_task

    if questions and calls:
        for rid, kind in kind_of.items():
            r = by_id.get(rid)
            if not kind.startswith("question-") or r is None:
                continue
            for a in r.attempts:
                recorded = calls(rid, a.attempt_id)
                if not recorded:
                    continue
                user: dict[str, Any] = next(
                    (m for m in recorded[0].request.get("messages", []) if m.get("role") == "user"), {}
                )
                content = user.get("content")
                if content != build_task(questions[rid]):
                    text_mismatch.append(f"{rid}/{a.attempt_id}")
    return {
        "rollouts": len(kind_of),
        "attempts": attempts_total,
        "lost": lost,
        "duplicates": duplicates,
        "succeeded_without_start": not_started,
        "failed_without_reason": failed_without_reason,
        "succeeded_without_reward": succeeded_without_reward,
        "reward_mismatch": reward_mismatch,
        "unexpected": unexpected,
        "masked_by_process_faults": masked,
        "question_text_mismatch": text_mismatch,
        "failure_reasons": dict(reasons.most_common()),
        "planned_outcomes": {k: dict(v) for k, v in planned_outcomes.items()},
        "final_states": dict(Counter(by_id[rid].state for rid in kind_of if rid in by_id)),
    }


class HangWatch(threading.Thread):
    """Flags attempts still RUNNING well past their deadline (a hang the system did not end)."""

    def __init__(self, client_factory: Callable[[], Any], slack_s: float = 30.0) -> None:
        super().__init__(name="hang-watch", daemon=True)
        self.client_factory = client_factory
        self.slack_s = slack_s
        self.hung: set[str] = set()
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(1.0):
            try:
                with self.client_factory() as c:
                    for r in c.list_rollouts(state="RUNNING", limit=1000):
                        a = r.attempts[-1]
                        if a.started_at and time.time() - a.started_at > r.deadline_s + self.slack_s:
                            self.hung.add(f"{r.rollout_id}/{a.attempt_id}")
            except Exception:
                continue

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


def recovery_times(events: list[Event], attempts: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """For each restart: seconds until the process was back, and until the next claim and the
    next SUCCEEDED finish after it was back (from the store's timestamps)."""
    out = []
    for ev in events:
        if ev.up_at is None or "second controller" in ev.kind:
            continue
        by = ev.target if ev.target.startswith("faults-") else None
        claims = [
            a.started_at
            for cid, a in attempts
            if a.started_at and a.started_at > ev.up_at and (by is None or cid == by)
        ]
        finishes = [
            a.finished_at
            for cid, a in attempts
            if a.finished_at and a.finished_at > ev.up_at and a.state == "SUCCEEDED" and (by is None or cid == by)
        ]
        out.append(
            {
                "fault": ev.kind,
                "back_s": ev.up_at - ev.at,
                "next_claim_s": (min(claims) - ev.at) if claims else None,
                "next_success_s": (min(finishes) - ev.at) if finishes else None,
            }
        )
    return out
