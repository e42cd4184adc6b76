"""The step tables a run's store adds to its metrics: how its agents used the calculator, failed
and lagged behind the weights (per step, from the recorded calls and attempts), where the GPU
waited for them (the generation phase split by the store's clocks), and what the calls of the
rollouts left out of their steps came back with.

Calculator use is counted by `calcx.trainer.rollouts.tool_use`, as the trainer's `calcx/train/...` metrics
are, on the `RecordedCall`s the store is read as through `calcx.server.store.reader` (read-only).
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Mapping
from pathlib import Path

from calcx.api.models import RecordedCall
from calcx.common.stats import union_length
from calcx.runs.steps import Metrics, idle_share
from calcx.server.store.reader import StoreReader
from calcx.trainer.rollouts.tool_use import ToolUse, rollout_tool_use, tool_use_metrics

_TRAIN_ID = re.compile(r"^calcx-train-s(\d+)-")
Spans = dict[int, list[tuple[float, float]]]


def step_rollouts(store: StoreReader) -> dict[int, dict[str, float]]:
    """Per training step, the rollouts of its batch (id -> creation time), from the rollout id
    `calcx-train-s{step}-...` the AgentLoop gives each rollout. A step that a killed run began and a
    resumed run made again holds two sets under one prefix: when the training ledger kept the step,
    only rollouts created at or after the first one it trained count (the resumed run's)."""
    created: dict[int, dict[str, float]] = defaultdict(dict)
    for rid, at in store.rollout_times():
        match = _TRAIN_ID.match(rid)
        if match:
            created[int(match.group(1))][rid] = at
    first_trained = store.first_trained_created()
    return {
        step: {rid: at for rid, at in ids.items() if at >= first_trained.get(step, float("-inf"))}
        for step, ids in created.items()
    }


def _step_of(rollouts: Mapping[int, Mapping[str, float]]) -> dict[str, int]:
    return {rid: step for step, ids in rollouts.items() for rid in ids}


def step_calls(store: StoreReader, rollouts: Mapping[int, Mapping[str, float]]) -> Spans:
    """[end - latency, end] of each answered model call, by the step of its rollout."""
    step_of = _step_of(rollouts)
    spans: Spans = defaultdict(list)
    for rid, created, latency in store.answered_call_times():
        step = step_of.get(rid)
        if step is not None:
            spans[step].append((created - latency, created))
    return spans


def busy_seconds_by_step(store: StoreReader) -> dict[int, float]:
    """Union length of the intervals in which at least one of the step's calls was inside vLLM."""
    return {step: union_length(spans) for step, spans in step_calls(store, step_rollouts(store)).items()}


def session_times(path: Path) -> dict[str, tuple[float, float]]:
    """Each training session's (started by verl, returned) from the trainer's `session_times.jsonl`,
    by its own rollout id."""
    times: dict[str, tuple[float, float]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            if row.get("partition") == "train":
                times[str(row["rollout_id"])] = (float(row["entered"]), float(row["returned"]))
    return times


def wait_breakdown(store: StoreReader, sessions: Path | None = None) -> dict[int, dict[str, float]]:
    """Where a step's generation phase had no model call in flight, from the store's clocks: from the
    batch's first rollout created to the first call sent (agents starting), gaps between calls (tool
    calls, agents between turns), from the last answer to the last attempt finished (rewards), and
    the first and last rollout's creation and finish as seconds for `wait_table` to set against
    verl's `timing_s/gen`. With the trainer's `session_times.jsonl` (`sessions`), also from the first
    session started to the first rollout created, from the last attempt finished to the last session
    returned, and the sessions' whole window."""
    times = session_times(sessions) if sessions is not None and sessions.is_file() else {}
    rollouts = step_rollouts(store)
    finished = store.last_finished()
    out: dict[int, dict[str, float]] = {}
    for step, spans in step_calls(store, rollouts).items():
        ids = rollouts[step]
        created = min(ids.values())
        first_sent, last_answer = min(s for s, _ in spans), max(e for _, e in spans)
        done = max((finished[rid] for rid in ids if rid in finished), default=last_answer)
        out[step] = {
            "before_first_call": first_sent - created,
            "between_calls": (last_answer - first_sent) - union_length(spans),
            "after_last_call": max(0.0, done - last_answer),
            "agents_window": done - created,
            "busy": union_length(spans),
        }
        spans_of_sessions = [times[rid] for rid in ids if rid in times]
        if spans_of_sessions:
            entered, returned = min(e for e, _ in spans_of_sessions), max(r for _, r in spans_of_sessions)
            out[step].update(
                {
                    "sessions_to_first_created": created - entered,
                    "finished_to_returned": returned - done,
                    "sessions_window": returned - entered,
                }
            )
    return out


def _wait_cells(m: Mapping, w: Mapping[str, float], with_sessions: bool) -> list[str]:
    gen = m.get("timing_s/gen")
    cells = [
        "-" if gen is None else f"{gen:.2f}",
        f"{w['busy']:.2f}",
        f"{w['before_first_call']:.2f}",
        f"{w['between_calls']:.2f}",
        f"{w['after_last_call']:.2f}",
        "-" if gen is None else f"{gen - w['agents_window']:.2f}",
    ]
    if with_sessions:
        known = "sessions_window" in w
        cells += [
            f"{w['sessions_to_first_created']:.2f}" if known else "-",
            f"{w['finished_to_returned']:.2f}" if known else "-",
            f"{gen - w['sessions_window']:.2f}" if known and gen is not None else "-",
        ]
    share = idle_share(m, w["busy"])
    cells.append("-" if share is None else f"{share:.0%}")
    return cells


def wait_table(steps: Metrics, waits: Mapping[int, Mapping[str, float]]) -> str:
    """One row a step: the generation phase split into the time calls were in vLLM and the idle parts
    `wait_breakdown` finds; "trainer" is the rest of verl's `timing_s/gen` outside the window from the
    first rollout's creation to the last one's finish (creating groups, reading the recorded calls)."""
    with_sessions = any("sessions_window" in w for w in waits.values())
    head = [
        "step",
        "rollout (gen) s",
        "calls in vLLM s",
        "before first call s",
        "between calls s",
        "after last call s",
        "trainer, outside agents s",
    ]
    if with_sessions:
        head += [
            "first session -> first rollout created s",
            "last attempt finished -> last session returned s",
            "verl, outside the sessions s",
        ]
    head.append("GPU idle waiting for agents")
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for step in sorted(waits):
        cells = [str(step), *_wait_cells(steps.get(step, {}), waits[step], with_sessions)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def agent_stats(store: StoreReader) -> dict[int, dict[str, float]]:
    """Per training step, from the recorded calls and attempts of the step's rollouts (`step_rollouts`:
    a resumed run's, not the killed run's of the same step). Calculator use is counted by
    `calcx.trainer.rollouts.tool_use` (what the trainer logs as `calcx/train/...`), over each rollout's latest
    attempt that recorded calls, its reference steps from the row its create body carried."""
    step_of = _step_of(step_rollouts(store))
    stats: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    by_attempt: dict[tuple[str, int], list[RecordedCall]] = defaultdict(list)
    for call in store.answered_calls():
        step = step_of.get(call.rollout_id)
        if step is None:
            continue
        by_attempt[(call.rollout_id, int(call.attempt_id))].append(call)
        if call.policy_version is not None:
            # a step-s rollout is on-policy when version s - 1 (the weights after step s - 1's
            # update) answers it; the lag is how many versions older the answering one was
            stats[step]["max_lag"] = max(stats[step]["max_lag"], (step - 1) - call.policy_version)
    latest: dict[str, int] = {}
    for rid, attempt_no in by_attempt:
        latest[rid] = max(latest.get(rid, attempt_no), attempt_no)
    chains = {rid: row.get("chain") for rid, row in store.rollout_rows() if rid in latest}
    uses: dict[int, list[ToolUse]] = defaultdict(list)
    for rid, attempt_no in latest.items():
        calls = sorted(by_attempt[(rid, attempt_no)], key=lambda c: c.seq)
        chain = chains.get(rid)
        uses[step_of[rid]].append(rollout_tool_use(calls, str(chain) if chain is not None else None))
    for rid, state in store.attempt_states():
        if state == "FAILED" and rid in step_of:
            stats[step_of[rid]]["failed_attempts"] += 1
    for step, items in uses.items():
        measured = tool_use_metrics(items, "train")
        stats[step]["rollouts"] = len(items)
        stats[step]["tool_share"] = measured["calcx/train/tool_use"]
        stats[step]["calls_per_rollout"] = measured["calcx/train/tool_calls_per_rollout"]
        stats[step]["parse_failures"] = measured["calcx/train/tool_parse_failures"]
        if "calcx/train/steps_computed" in measured:
            stats[step]["steps_computed"] = measured["calcx/train/steps_computed"]
    return {k: dict(v) for k, v in stats.items()}


def agent_table(stats: Mapping[int, Mapping[str, float]]) -> str:
    head = [
        "step",
        "rollouts",
        "successful calculator call",
        "reference steps computed",
        "tool calls / rollout",
        "tool-call parse failures",
        "failed attempts",
        "max policy lag",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for step in sorted(stats):
        m = stats[step]
        computed = f"{m['steps_computed']:.0%}" if "steps_computed" in m else "-"
        lines.append(
            f"| {step} | {int(m.get('rollouts', 0))} | {m.get('tool_share', 0.0):.0%} | {computed} | "
            f"{m.get('calls_per_rollout', 0.0):.2f} | {int(m.get('parse_failures', 0))} | "
            f"{int(m.get('failed_attempts', 0))} | {int(m.get('max_lag', 0))} |"
        )
    return "\n".join(lines)


def _finish_reason(response: bytes | None) -> str:
    try:
        return str(json.loads(response)["choices"][0].get("finish_reason"))  # type: ignore[arg-type]
    except (TypeError, ValueError, KeyError, IndexError):
        return "(no choice)"


def evicted_calls(store: StoreReader, incomplete: Path) -> str:
    """What the model calls of the rollouts left out of their steps (`incomplete_groups.jsonl`)
    came back with: HTTP status, vLLM's finish reason, and whether any response token arrived."""
    rollout_ids = sorted(
        {json.loads(line)["rollout_id"] for line in incomplete.read_text().splitlines() if line.strip()}
    )
    kinds: Counter[tuple[int, str, str]] = Counter()
    without_calls = 0
    for rid in rollout_ids:
        rows = store.call_outcomes(rid)
        without_calls += not rows
        for status, response, any_tokens in rows:
            kinds[(status, _finish_reason(response), "some" if any_tokens else "none")] += 1
    lines = [
        f"{len(rollout_ids)} rollouts left out; {without_calls} of them recorded no call",
        "",
        "| HTTP status | finish reason | response tokens | calls |",
        "|---:|---|---|---:|",
    ]
    lines += [
        f"| {status} | {finish} | {tokens} | {count} |" for (status, finish, tokens), count in sorted(kinds.items())
    ]
    return "\n".join(lines)
