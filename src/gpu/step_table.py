"""Per-step table of a verl run's metrics (verl's `file` logger JSONL), for docs/gpu-run.md.

    python3 src/gpu/step_table.py METRICS.jsonl [--calls calcx.db [--incomplete incomplete_groups.jsonl]]

With `--calls` (the calcx server's SQLite store), the GPU's idle share of each step while it
waited for agents is measured from the recorded model calls: the generation phase minus the union
of the intervals in which at least one call was inside vLLM, over the whole step; and the store's
agent table follows the step table: per step, the training rollouts, the share with a successful
calculator call, tool calls per rollout, tool-call parse failures (a `<tool_call>` in the text that
vLLM's parser did not turn into a call; all three counted by `calcx.trainer.rollouts.tool_use`, as the
trainer's `calcx/train/...` metrics are), failed attempts (retried as new ones) and the largest policy-version lag of a call:
how many weight syncs behind the weights its rollout's step starts from (step - 1) the version that
answered it was (the server records the version it serves at the time of each call). With
`--incomplete` too, what the calls of the rollouts left out of their steps came back with. And the
validation per problem: each validation's accuracy with its standard error, and which problems a
validation got right that the one before it got wrong and the other way, with the change's paired
standard error (the same problems both times); with `--versus OTHER.db`, the same against another
run's store at each step both validated (two recipes on the same validation set).
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from calcx.common.stats import mean_and_standard_error, union_length  # noqa: E402
from calcx.contract.labels import origin_of, scored_reward  # noqa: E402
from calcx.trainer.rollouts.tool_use import ToolUse, rollout_tool_use, tool_use_metrics  # noqa: E402


def read_metrics(path: Path) -> dict[int, dict]:
    steps: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            steps.setdefault(int(row["step"]), {}).update(row["data"])
    return steps


_TRAIN_ID = re.compile(r"^calcx-train-s(\d+)-")


def step_rollouts(con: sqlite3.Connection) -> dict[int, dict[str, float]]:
    """Per training step, the rollouts of its batch (id -> creation time), from the rollout id
    `calcx-train-s{step}-...` the AgentLoop gives each rollout. A step that a killed run began and a
    resumed run made again holds two sets under one prefix: when the training ledger kept the step,
    only rollouts created at or after the first one it trained count (the resumed run's)."""
    created: dict[int, dict[str, float]] = defaultdict(dict)
    for rid, at in con.execute("select rollout_id, created_at from rollouts"):
        match = _TRAIN_ID.match(str(rid))
        if match:
            created[int(match.group(1))][str(rid)] = float(at)
    first_trained: dict[int, float] = {}
    for step, at in con.execute(
            "select t.step, min(r.created_at) from trained t join rollouts r on r.rollout_id = t.rollout_id "
            "where t.rolled_back_at is null group by t.step"):
        first_trained[int(step)] = float(at)
    return {step: {rid: at for rid, at in ids.items() if at >= first_trained.get(step, float("-inf"))}
            for step, ids in created.items()}


def _step_calls(con: sqlite3.Connection) -> dict[int, list[tuple[float, float]]]:
    """[end - latency, end] of each answered model call, by the step of its rollout."""
    step_of = {rid: step for step, ids in step_rollouts(con).items() for rid in ids}
    spans: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for created, latency, rid in con.execute(
            "select created_at, latency_s, rollout_id from calls where status_code = 200"):
        step = step_of.get(str(rid))
        if step is not None:
            spans[step].append((float(created) - float(latency), float(created)))
    return spans


def busy_seconds_by_step(db: Path) -> dict[int, float]:
    """Union length of the intervals in which at least one of the step's calls was inside vLLM."""
    return {step: union_length(spans) for step, spans in _step_calls(sqlite3.connect(db)).items()}


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


def wait_breakdown(db: Path, sessions: Path | None = None) -> dict[int, dict[str, float]]:
    """Where a step's generation phase had no model call in flight, from the store's clocks: from the
    batch's first rollout created to the first call sent (agents starting), gaps between calls (tool
    calls, agents between turns), from the last answer to the last attempt finished (rewards), and
    the first and last rollout's creation and finish as seconds for `wait_table` to set against
    verl's `timing_s/gen`. With the trainer's `session_times.jsonl` (`sessions`), also from the first
    session started to the first rollout created, from the last attempt finished to the last session
    returned, and the sessions' whole window."""
    times = session_times(sessions) if sessions is not None and sessions.is_file() else {}
    con = sqlite3.connect(db)
    rollouts = step_rollouts(con)
    finished: dict[str, float] = {}
    for rid, at in con.execute("select rollout_id, max(finished_at) from attempts "
                               "where finished_at is not null group by rollout_id"):
        finished[str(rid)] = float(at)
    out: dict[int, dict[str, float]] = {}
    for step, spans in _step_calls(con).items():
        ids = rollouts[step]
        created = min(ids.values())
        first_sent, last_answer = min(s for s, _ in spans), max(e for _, e in spans)
        done = max((finished[rid] for rid in ids if rid in finished), default=last_answer)
        out[step] = {"before_first_call": first_sent - created,
                     "between_calls": (last_answer - first_sent) - union_length(spans),
                     "after_last_call": max(0.0, done - last_answer),
                     "agents_window": done - created, "busy": union_length(spans)}
        spans_of_sessions = [times[rid] for rid in ids if rid in times]
        if spans_of_sessions:
            entered, returned = min(e for e, _ in spans_of_sessions), max(r for _, r in spans_of_sessions)
            out[step].update({"sessions_to_first_created": created - entered, "finished_to_returned": returned - done,
                              "sessions_window": returned - entered})
    return out


def wait_table(steps: dict[int, dict], waits: dict[int, dict[str, float]]) -> str:
    """One row a step: the generation phase split into the time calls were in vLLM and the idle parts
    `wait_breakdown` finds; "trainer" is the rest of verl's `timing_s/gen` outside the window from the
    first rollout's creation to the last one's finish (creating groups, reading the recorded calls)."""
    with_sessions = any("sessions_window" in w for w in waits.values())
    head = ["step", "rollout (gen) s", "calls in vLLM s", "before first call s", "between calls s",
            "after last call s", "trainer, outside agents s"]
    if with_sessions:
        head += ["first session -> first rollout created s", "last attempt finished -> last session returned s",
                 "verl, outside the sessions s"]
    head.append("GPU idle waiting for agents")
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for step in sorted(waits):
        m, w = steps.get(step, {}), waits[step]
        gen = m.get("timing_s/gen")
        cells = [str(step), "-" if gen is None else f"{gen:.2f}", f"{w['busy']:.2f}", f"{w['before_first_call']:.2f}",
                 f"{w['between_calls']:.2f}", f"{w['after_last_call']:.2f}",
                 "-" if gen is None else f"{gen - w['agents_window']:.2f}"]
        if with_sessions:
            known = "sessions_window" in w
            cells += [f"{w['sessions_to_first_created']:.2f}" if known else "-",
                      f"{w['finished_to_returned']:.2f}" if known else "-",
                      f"{gen - w['sessions_window']:.2f}" if known and gen is not None else "-"]
        share = idle_share(m, w["busy"])
        cells.append("-" if share is None else f"{share:.0%}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)



def agent_stats(db: Path) -> dict[int, dict[str, float]]:
    """Per training step, from the recorded calls and attempts of the step's rollouts (`step_rollouts`:
    a resumed run's, not the killed run's of the same step). Calculator use is counted by `calcx.trainer.rollouts.tool_use` (what the trainer logs as
    `calcx/train/...`), over each rollout's latest attempt that recorded calls."""
    con = sqlite3.connect(db)
    step_of = {rid: step for step, ids in step_rollouts(con).items() for rid in ids}
    stats: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    by_attempt: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for rid, attempt_no, seq, request, response, version in con.execute(
            "select rollout_id, attempt_no, seq, request, response, policy_version from calls "
            "where status_code = 200"):
        step = step_of.get(str(rid))
        if step is None:
            continue
        by_attempt[(str(rid), int(attempt_no))].append({"seq": seq, "request": request, "response": response})
        if version is not None:
            # a step-s rollout is on-policy when version s - 1 (the weights after step s - 1's
            # update) answers it; the lag is how many versions older the answering one was
            stats[step]["max_lag"] = max(stats[step]["max_lag"], (step - 1) - int(version))
    latest: dict[str, int] = {}
    for rid, attempt_no in by_attempt:
        latest[rid] = max(latest.get(rid, attempt_no), attempt_no)
    uses: dict[int, list[ToolUse]] = defaultdict(list)
    for rid, attempt_no in latest.items():
        calls = sorted(by_attempt[(rid, attempt_no)], key=lambda c: int(c["seq"]))
        uses[step_of[rid]].append(rollout_tool_use(calls))
    for rid, state in con.execute("select rollout_id, state from attempts"):
        if state == "FAILED" and str(rid) in step_of:
            stats[step_of[str(rid)]]["failed_attempts"] += 1
    for step, items in uses.items():
        measured = tool_use_metrics(items, "train")
        stats[step]["rollouts"] = len(items)
        stats[step]["tool_share"] = measured["calcx/train/tool_use"]
        stats[step]["calls_per_rollout"] = measured["calcx/train/tool_calls_per_rollout"]
        stats[step]["parse_failures"] = measured["calcx/train/tool_parse_failures"]
    return {k: dict(v) for k, v in stats.items()}


def evicted_calls(db: Path, incomplete: Path) -> str:
    """What the model calls of the rollouts left out of their steps (`incomplete_groups.jsonl`)
    came back with: HTTP status, vLLM's finish reason, and whether any response token arrived."""
    rollout_ids = sorted({json.loads(line)["rollout_id"] for line in incomplete.read_text().splitlines()
                          if line.strip()})
    con = sqlite3.connect(db)
    kinds: Counter[tuple[int, str, str]] = Counter()
    without_calls = 0
    for rid in rollout_ids:
        rows = con.execute("select status_code, response, length(response_token_ids) from calls "
                           "where rollout_id = ?", (rid,)).fetchall()
        without_calls += not rows
        for status, response, token_bytes in rows:
            try:
                finish = str(json.loads(response)["choices"][0].get("finish_reason"))
            except (TypeError, ValueError, KeyError, IndexError):
                finish = "(no choice)"
            kinds[(int(status), finish, "none" if not token_bytes else "some")] += 1
    lines = [f"{len(rollout_ids)} rollouts left out; {without_calls} of them recorded no call", "",
             "| HTTP status | finish reason | response tokens | calls |", "|---:|---|---|---:|"]
    lines += [f"| {status} | {finish} | {tokens} | {count} |" for (status, finish, tokens), count in sorted(kinds.items())]
    return "\n".join(lines)


def agent_table(stats: dict[int, dict[str, float]]) -> str:
    head = ["step", "rollouts", "successful calculator call", "tool calls / rollout", "tool-call parse failures",
            "failed attempts", "max policy lag"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for step in sorted(stats):
        m = stats[step]
        lines.append(f"| {step} | {int(m.get('rollouts', 0))} | {m.get('tool_share', 0.0):.0%} | "
                     f"{m.get('calls_per_rollout', 0.0):.2f} | {int(m.get('parse_failures', 0))} | "
                     f"{int(m.get('failed_attempts', 0))} | {int(m.get('max_lag', 0))} |")
    return "\n".join(lines)


TOOL_USE_COLUMNS = (("equal-reward groups", "calcx/train/equal_reward_groups", "{:.0%}"),
                    ("entropy", "actor/entropy", "{:.3f}"),
                    ("train tool use", "calcx/train/tool_use", "{:.0%}"),
                    ("train calls / rollout", "calcx/train/tool_calls_per_rollout", "{:.2f}"),
                    ("train parse failures", "calcx/train/tool_parse_failures", "{:.0f}"),
                    ("val tool use", "calcx/val/tool_use", "{:.0%}"),
                    ("val calls / rollout", "calcx/val/tool_calls_per_rollout", "{:.2f}"),
                    ("val parse failures", "calcx/val/tool_parse_failures", "{:.0f}"))


def tool_use_table(steps: dict[int, dict]) -> str:
    """The trainer's own `calcx/{train,val}/...` tool-use metrics per step ("" when the run logged
    none: an older run, or verl's own agent loop)."""
    rows = [(step, m) for step, m in sorted(steps.items()) if any(key in m for _, key, _ in TOOL_USE_COLUMNS)]
    if not rows:
        return ""
    lines = ["| step | " + " | ".join(name for name, _, _ in TOOL_USE_COLUMNS) + " |",
             "|" + "---:|" * (len(TOOL_USE_COLUMNS) + 1)]
    for step, m in rows:
        cells = [fmt.format(m[key]) if key in m else "-" for _, key, fmt in TOOL_USE_COLUMNS]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _staleness(m: dict) -> str:
    """verl's largest trajectory staleness of the step's batch: the trained step minus one minus the
    newest policy version that served a trajectory (0: on-policy)."""
    value = m.get("training/off_policy/trajectory_staleness/max")
    return "-" if value is None else f"{value:.0f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def idle_share(m: dict, busy: float | None) -> float | None:
    """The share of the step the GPU waited for agents: the generation phase with no call inside
    vLLM (`busy`: the seconds with at least one call there), over the whole step."""
    gen, total = m.get("timing_s/gen"), m.get("timing_s/step")
    if busy is None or gen is None or not total:
        return None
    return max(0.0, gen - busy) / total


def steady_steps(steps: dict[int, dict], restarts: set[int]) -> list[int]:
    """The steps that paid no start-up: all but the first and the first of each restart."""
    return [step for step in sorted(steps)[1:] if step not in restarts]


def idle_summary(steps: dict[int, dict], busy: dict[int, float], restarts: set[int] = frozenset()) -> str | None:
    """The mean and largest idle share over the steps after the first (the first pays start-up
    costs inside its generation phase), nor the first step of a restarted run (`restarts`, from
    the run's starts file), or None when no such step was measured."""
    shares = {step: idle_share(steps[step], busy.get(step)) for step in steady_steps(steps, restarts)}
    measured = {step: share for step, share in shares.items() if share is not None}
    if not measured:
        return None
    worst = max(measured, key=lambda step: measured[step])
    left_out = sorted(restarts & set(steps))
    besides = (f" and step{'s' if len(left_out) > 1 else ''} {', '.join(map(str, left_out))}, the first after a restart"
               if left_out else "")
    return (f"GPU idle waiting for agents: mean {statistics.mean(measured.values()):.1%} of a step over "
            f"{len(measured)} step{'s' if len(measured) != 1 else ''} after the first{besides} (largest {measured[worst]:.1%}, step {worst})")


def restarted_steps(starts: Path | None) -> set[int]:
    """The first steps of the restarts whose steps the metrics file still holds, from the run's
    starts.jsonl (calcx train writes a line each start). A start at step N sets aside the rows from
    N on, so it also ends every earlier start at N or later; the first start left is the run's."""
    if starts is None or not starts.is_file():
        return set()
    kept: list[int] = []
    for line in starts.read_text().splitlines():
        try:
            first = json.loads(line)["first_step"]
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by a crash while it was written says nothing
        kept = [step for step in kept if step < first] + [first]
    return set(kept[1:])


def table(steps: dict[int, dict], busy: dict[int, float] | None) -> str:
    """One row a step. Evicted samples are counted by why verl left them out: a group with a failed
    attempt (`rollout_failure`) or one older than the allowed staleness (`off_policy`, async)."""
    head = ["step", "step s", "rollout (gen) s", "old log-prob s", "update s", "weight sync s",
            "tokens/s", "update MFU", "GPU mem peak GB", "GPU idle waiting for agents", "mean reward",
            "val accuracy", "trajectory staleness max", "evicted samples: failed", "evicted samples: stale"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for step in sorted(steps):
        m = steps[step]
        if "timing_s/step" not in m:
            continue
        idle = "n/a"
        if busy is not None:
            share = idle_share(m, busy.get(step))
            idle = "n/a" if share is None else f"{share:.0%}"
        val = [v for k, v in m.items() if k.startswith("val-core/") and k.endswith("mean@1")]
        cells = [str(step), f"{m['timing_s/step']:.2f}", f"{m.get('timing_s/gen', float('nan')):.2f}",
                 f"{m.get('timing_s/old_log_prob', float('nan')):.2f}", f"{m.get('timing_s/update_actor', float('nan')):.2f}",
                 f"{m.get('timing_s/update_weights', float('nan')):.2f}", f"{m.get('perf/throughput', float('nan')):.0f}",
                 _percent(m.get("perf/mfu/actor")),
                 f"{m.get('actor/perf/max_memory_allocated_gb', float('nan')):.1f}", idle,
                 f"{m.get('critic/score/mean', float('nan')):.3f}", f"{statistics.mean(val):.3f}" if val else "-",
                 _staleness(m), f"{m.get('training/rollout_failure/evicted_samples', 0):.0f}",
                 f"{m.get('training/off_policy/evicted_samples', 0):.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def validation_outcomes(db: Path) -> dict[int, dict[str, float]]:
    """Per validation step, each problem's reward (its Calc-X row id -> reward; the mean where a row
    had several sessions), from the store's rollouts labelled partition `val` (one store holds one
    run). A rollout that did not succeed with a reward is an infrastructure failure, not a wrong
    answer: left out, as is one whose row has no id (nothing to pair it by)."""
    rewards: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        for spec_text, state, reward in con.execute("select spec, state, reward from rollouts"):
            spec = json.loads(spec_text)
            origin = origin_of(spec.get("labels") or {})
            row_id = (spec.get("row") or {}).get("id")
            scored = scored_reward(state, reward)
            if origin is not None and origin[0] == "val" and row_id is not None and scored is not None:
                rewards[origin[1]][str(row_id)].append(scored)
    finally:
        con.close()
    return {step: {row: statistics.mean(values) for row, values in rows.items()}
            for step, rows in sorted(rewards.items())}


def validation_sources(db: Path) -> dict[str, str]:
    """Each validation problem's source (its Calc-X row id -> the row's `source`, e.g. gsm8k or
    gsm8k-hard), from the same rollouts `validation_outcomes` reads."""
    sources: dict[str, str] = {}
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        for (spec_text,) in con.execute("select spec from rollouts"):
            spec = json.loads(spec_text)
            row = spec.get("row") or {}
            origin = origin_of(spec.get("labels") or {})
            if origin is not None and origin[0] == "val" and row.get("id") is not None:
                sources[str(row["id"])] = str(row.get("source") or "unknown")
    finally:
        con.close()
    return sources


def split_by_source(outcomes: dict[int, dict[str, float]], sources: dict[str, str]
                    ) -> dict[str, dict[int, dict[str, float]]]:
    """The outcomes of each source apart ({source: {step: {row: reward}}}), sources in name order."""
    split: dict[str, dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for step, rows in outcomes.items():
        for row, reward in rows.items():
            split[sources.get(row, "unknown")][step][row] = reward
    return {source: dict(steps) for source, steps in sorted(split.items())}


def _accuracy(outcomes: dict[str, float]) -> str:
    mean, se = mean_and_standard_error(outcomes.values())
    return f"{mean:.3f} ({se:.3f})"


def _change(before: dict[str, float], after: dict[str, float]) -> tuple[int, int, int, str]:
    """Over the problems both hold: how many, how many `after` scored higher, lower, and the change
    of accuracy with its paired standard error."""
    shared = sorted(before.keys() & after.keys())
    diffs = [after[row] - before[row] for row in shared]
    if not diffs:
        return 0, 0, 0, "-"
    mean, se = mean_and_standard_error(diffs)
    return len(shared), sum(d > 0 for d in diffs), sum(d < 0 for d in diffs), f"{mean:+.3f} ({se:.3f})"


def validation_table(outcomes: dict[int, dict[str, float]]) -> str:
    """Each validation's accuracy (standard error) and what changed since the validation before."""
    lines = ["| step | problems | accuracy (SE) | problems in both | better now | "
             "worse now | change (paired SE) |", "|" + "---:|" * 7]
    previous: dict[str, float] | None = None
    for step, rows in outcomes.items():
        since = ["-"] * 4 if previous is None else [str(cell) for cell in _change(previous, rows)]
        cells = [str(len(rows)), _accuracy(rows)] + since
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
        previous = rows
    return "\n".join(lines)


def versus_table(mine: dict[int, dict[str, float]], other: dict[int, dict[str, float]]) -> str:
    """At each step both runs validated: both accuracies and this run's change against the other's."""
    lines = ["| step | problems in both | this run (SE) | other run (SE) | better here | "
             "worse here | difference (paired SE) |", "|" + "---:|" * 7]
    for step in sorted(mine.keys() & other.keys()):
        shared, better, worse, change = _change(other[step], mine[step])
        lines.append(f"| {step} | {shared} | {_accuracy(mine[step])} | {_accuracy(other[step])} | "
                     f"{better} | {worse} | {change} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("metrics", type=Path)
    parser.add_argument("--calls", type=Path, help="the calcx server's SQLite store of the run")
    parser.add_argument("--incomplete", type=Path,
                        help="the run's incomplete_groups.jsonl: with --calls, what their calls came back with")
    parser.add_argument("--sessions", type=Path,
                        help="the run's session_times.jsonl: with --calls, the trainer's sessions in the wait table")
    parser.add_argument("--starts", type=Path,
                        help="the run's starts.jsonl: a restart's first step pays start-up, left out of the wait summary")
    parser.add_argument("--outcomes", type=Path, metavar="CSV",
                        help="with --calls, write each validation problem's reward per step (step,id,source,reward): "
                             "what a run record keeps of its store, for pairing runs without it")
    parser.add_argument("--versus", type=Path, metavar="OTHER_DB",
                        help="with --calls, another run's store: the two runs' validations per problem, step by step")
    args = parser.parse_args(argv)
    if args.versus and not args.calls:
        parser.error("--versus compares this run's store (--calls) with another's: give --calls too")
    if args.outcomes and not args.calls:
        parser.error("--outcomes reads the run's store (--calls): give --calls too")
    steps = read_metrics(args.metrics)
    busy = busy_seconds_by_step(args.calls) if args.calls else None
    print(table(steps, busy))
    tool_use = tool_use_table(steps)
    if tool_use:
        print()
        print(tool_use)
    if args.calls:
        print()
        print(agent_table(agent_stats(args.calls)))
        print()
        print(wait_table(steps, wait_breakdown(args.calls, args.sessions)))
        if args.incomplete and args.incomplete.is_file():
            print()
            print(evicted_calls(args.calls, args.incomplete))
        outcomes = validation_outcomes(args.calls)
        sources = validation_sources(args.calls)
        if args.outcomes:
            args.outcomes.write_text("step,id,source,reward\n" + "".join(
                f"{step},{row},{sources.get(row, 'unknown')},{reward:g}\n"
                for step, rows in outcomes.items() for row, reward in sorted(rows.items())))
        by_source = split_by_source(outcomes, sources)
        # several sources (e.g. gsm8k and its hard split): all of them, then each apart
        parts = [("", outcomes)] + ([(f" ({name})", part) for name, part in by_source.items()]
                                    if len(by_source) > 1 else [])
        for label, part in parts:
            if part:
                print(f"\nvalidation per problem{label} (the store's validation rollouts; SE: standard error):\n")
                print(validation_table(part))
        if args.versus:
            other = validation_outcomes(args.versus)
            other_parts = {"": other, **{f" ({name})": part for name, part in
                                         split_by_source(other, validation_sources(args.versus)).items()}}
            for label, part in parts:
                print(f"\nthis run against {args.versus}{label}, the same problems at each step both validated:\n")
                print(versus_table(part, other_parts.get(label, {})))
    validation = [(step, statistics.mean(v for k, v in m.items() if k.startswith("val-core/") and k.endswith("mean@1")))
                  for step, m in sorted(steps.items())
                  if any(k.startswith("val-core/") and k.endswith("mean@1") for k in m)]
    if validation:
        print("\nvalidation accuracy: " + ", ".join(f"step {step}: {acc:.3f}" for step, acc in validation))
    restarts = restarted_steps(args.starts)
    timed = {s: m for s, m in steps.items() if "timing_s/step" in m}
    if busy is not None:
        summary = idle_summary(timed, busy, restarts)
        if summary:
            print("\n" + summary)
    after_first = [timed[s]["timing_s/step"] for s in steady_steps(timed, restarts)]
    if after_first:
        besides = ", nor the first after a restart" if restarts & set(timed) else ""
        print(f"\nmean step time after the first{besides}: {statistics.mean(after_first):.2f} s "
              f"(median {statistics.median(after_first):.2f} s over {len(after_first)} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
