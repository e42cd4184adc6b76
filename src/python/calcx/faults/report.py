"""The fault run's figures as the Markdown page benchmarks/FAULTS.md."""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections import Counter
from typing import Any

from calcx.faults.plan import PLANNED, REFUSED_AT_CREATE


def figures(res: dict[str, Any], want_rows: int) -> list[tuple[str, str, str, bool]]:
    """The run's figures as (figure, value, target, on target), for a run of ``want_rows`` rows
    (``--n``): the table of benchmarks/FAULTS.md and the benchmark's exit status both come from
    this one list."""
    a = res["audit"]
    h = res["hostile"]
    rows = {k: sum(v.values()) for k, v in a["planned_outcomes"].items() if k != "clean"}
    process: Counter[str] = Counter(ev["kind"] for ev in res["events"])
    refused = sum(n for k, v in a["planned_outcomes"].items() if k in REFUSED_AT_CREATE for n in v.values())
    silent = sum(1 for u in a["unexpected"] if "ended SUCCEEDED" in u)
    return [
        (
            "rows in the run (submitted at once)",
            f"{a['rollouts'] + refused} ({a['rollouts']} rollouts created, "
            f"{a['attempts']} attempts; {refused} refused at creation, 422)",
            f">= {want_rows}",
            a["rollouts"] + refused >= want_rows,
        ),
        (
            "faults and hostile inputs injected",
            f"{sum(rows.values())} rows of {len(rows)} kinds + "
            f"{sum(process.values())} process faults of {len(process)} kinds",
            "every kind planned",
            True,
        ),
        ("rollouts lost (not terminal or missing)", str(len(a["lost"])), "0", not a["lost"]),
        (
            "rewards lost (SUCCEEDED without reward; agent-posted reward missing)",
            f"{len(a['succeeded_without_reward'])}; {len(a['reward_mismatch'])}",
            "0; 0",
            not (a["succeeded_without_reward"] or a["reward_mismatch"]),
        ),
        ("duplicate runs (an attempt started twice)", str(len(a["duplicates"])), "0", not a["duplicates"]),
        ("hangs (RUNNING > deadline + 30 s, or never terminal)", str(len(res["hangs"])), "0", not res["hangs"]),
        ("FAILED attempts without a reason", str(len(a["failed_without_reason"])), "0", not a["failed_without_reason"]),
        ("planned faults that ended otherwise than planned", str(len(a["unexpected"])), "0", not a["unexpected"]),
        (
            "planned faults never seen (every attempt cut short by a process fault)",
            str(len(a["masked_by_process_faults"])),
            "0",
            not a["masked_by_process_faults"],
        ),
        ("infrastructure faults that ended SUCCEEDED (silent reward 0)", str(silent), "0", not silent),
        (
            "hostile question texts that reached the agent changed",
            str(len(a["question_text_mismatch"])),
            "0",
            not a["question_text_mismatch"],
        ),
        (
            "hostile answers executed (canary file created)",
            str(int(bool(res["canary_exists"]))),
            "0",
            not res["canary_exists"],
        ),
        (
            "bad requests answered with the right status and code",
            f"{h['right']}/{h['requests']} " f"({h['kinds']} kinds)",
            "all",
            h["right"] == h["requests"],
        ),
        (
            "processes of a SIGKILLed controller alive after its restart",
            str(len(res.get("orphans", []))),
            "0",
            not res.get("orphans"),
        ),
        ("processes left after shutdown", str(len(res["leftover_processes"])), "0", not res["leftover_processes"]),
        ("wall time of the run (submit to last terminal)", f"{res['wall_s']:.1f} s", "", True),
    ]


def off_target(res: dict[str, Any], want_rows: int) -> list[str]:
    """The figures that missed their target (empty: the run is clean)."""
    return [name for name, _, _, ok in figures(res, want_rows) if not ok]


def render_markdown(
    args: argparse.Namespace,
    res: dict[str, Any],
    queued: dict[str, Any] | None,
    command: str,
    killed: dict[str, Any] | None = None,
) -> str:
    a = res["audit"]
    h = res["hostile"]
    rows = {k: sum(v.values()) for k, v in a["planned_outcomes"].items() if k != "clean"}
    process: Counter[str] = Counter(ev["kind"] for ev in res["events"])
    lines = [
        "# Faults and hostile inputs: what calcx survives",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} on this machine "
        f"({os.cpu_count()} CPU cores, shared with other work; {platform.machine()}, Python "
        f"{platform.python_version()}). Command:",
        "",
        "```",
        command,
        "```",
        "",
        f"Settings: {getattr(args, 'concurrency', '?')} rollouts at once per controller, rollout deadline "
        f"{getattr(args, 'deadline_s', '?')} s, server lease {getattr(args, 'lease_s', '?')} s, "
        f"gateway upstream timeout {getattr(args, 'upstream_timeout_s', '?')} s with 2 retries, "
        f"agents' calculator timeout {getattr(args, 'calculator_timeout_s', '?')} s and whole-run bound "
        f"{getattr(args, 'agent_timeout_s', '?')} s (lowered so that hangs end fast), model client retries at "
        "their default (6).",
        "",
        "## Figures",
        "",
        "| figure | value | target |",
        "|---|---|---|",
        *(f"| {name} | {value} | {target} |" for name, value, target, _ in figures(res, args.n)),
        "",
        "## Row faults and hostile inputs",
        "",
        "Each row carries its fault (a stub or proxy marker, a hanging calculator expression, a hostile "
        "text) or is the target of a kill. A planned fault is judged by its first attempt that no process "
        "fault cut short; rows that should succeed by their last attempt.",
        "",
        "| rows | count | ended | planned |",
        "|---|---|---|---|",
    ]
    for kind, count in sorted(rows.items()):
        outcome = ", ".join(f"{o} x{n}" for o, n in sorted(a["planned_outcomes"][kind].items()))
        want = PLANNED[kind][1]
        planned = f"{want[0]}{' ' + want[1] if want[1] and want[1] != '*' else ''}"
        if want[1] == "*":
            planned += " (timeout or model_unreachable)"
        elif kind.startswith("answer-") or kind in ("model-bad-tool-json", "reflection-tool-call"):
            planned += ", reward 0"
        lines.append(f"| {kind} | {count} | {outcome} | {planned} |")
    lines += ["", "## Process faults", "", "| fault | count |", "|---|---|"]
    lines += [f"| {kind} | {count} |" for kind, count in sorted(process.items())]
    lines += [
        "",
        f"Clean rows ({sum(a['planned_outcomes'].get('clean', {}).values())}) ended (after retries): "
        f"{', '.join(f'{o} x{n}' for o, n in sorted(a['planned_outcomes'].get('clean', {}).items()))}.",
        f"Collateral infrastructure failures of clean and hostile-question rows were retried as a trainer "
        f"would ({', '.join(f'{k} x{v}' for k, v in sorted(res['retried'].items())) or 'none'}); final "
        f"states: {', '.join(f'{k} {v}' for k, v in sorted(a['final_states'].items()))}.",
        f"FAILED attempts by reason: {', '.join(f'{k} {v}' for k, v in a['failure_reasons'].items())}.",
        "",
        "## Recovery after restarts",
        "",
        "| fault | process back after | next claim after | next SUCCEEDED finish after |",
        "|---|---|---|---|",
    ]
    fmt = lambda v: "-" if v is None else f"{v:.1f} s"  # noqa: E731
    for r in res["recovery"]:
        lines.append(f"| {r['fault']} | {fmt(r['back_s'])} | {fmt(r['next_claim_s'])} | {fmt(r['next_success_s'])} |")
    lines += [
        "",
        "Times are from the fault (signal sent) to the event; claims and finishes come from the store's "
        "timestamps (the restarted controller's own, for a controller restart).",
        "",
        "## Hostile client",
        "",
        f"{h['requests']} requests of {h['kinds']} kinds during the run (wrong or missing keys on every "
        "endpoint, forged and other attempts' tokens, malformed, oversized and unknown events, events and "
        "gateway calls for unknown and finished rollouts, cross-rollout gateway calls, bad bodies and "
        f"queries); expected statuses {', '.join(f'{k} x{v}' for k, v in h['by_status'].items())}. "
        f"{h['skipped_server_down']} requests got no answer while the server was restarting (not counted).",
        "",
    ]
    if h["wrong"]:
        lines += ["Wrong answers:", ""] + [f"- {w}" for w in h["wrong"]] + [""]
    problems = {
        k: a[k]
        for k in (
            "lost",
            "duplicates",
            "failed_without_reason",
            "succeeded_without_reward",
            "reward_mismatch",
            "unexpected",
            "masked_by_process_faults",
            "question_text_mismatch",
        )
        if a[k]
    }
    if problems or res["hangs"] or res["injector_errors"] or res.get("orphans"):
        lines += [
            "## Problems found",
            "",
            "```",
            json.dumps(
                {
                    **problems,
                    "hangs": res["hangs"],
                    "injector_errors": res["injector_errors"],
                    "orphans": res.get("orphans"),
                },
                indent=1,
            )[:6000],
            "```",
            "",
        ]
    if queued:
        q = queued
        lines += [
            f"## {q['queued']:,} rollouts queued at once",
            "",
            f"No controller running; one `POST /v1/rollouts` of {q['queued']:,} rollouts took "
            f"{q['create_ms']:.0f} ms. Server RSS: idle {q['rss_mb']['idle']:.0f} MB, after the enqueue "
            f"{q['rss_mb']['after_enqueue']:.0f} MB, after the probes {q['rss_mb']['after_probes']:.0f} MB, "
            f"after {q['drain_s']:.0f} s of draining {q['rss_mb']['after_drain']:.0f} MB.",
            "",
            "| request | p50 | p99 |",
            "|---|---|---|",
        ]
        for name, (p50, p99) in q["latency_ms"].items():
            lines.append(f"| {name} | {p50:.1f} ms | {p99:.1f} ms |")
        lines += [
            "",
            f"After {q['drain_s']:.0f} s with one controller: "
            f"{', '.join(f'{k} {v}' for k, v in sorted(q['states_after_drain'].items()))} "
            f"(100 FAILED `cancelled` are the claim-latency probes); lost: {q['lost']}.",
            "",
        ]
    if killed:
        from calcx.faults.killed_trainer import render

        lines += render(killed)
    lines += ["## How the faults are made", "", "See [docs/faults.md](../docs/faults.md).", ""]
    return "\n".join(lines)
