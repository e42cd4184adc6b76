"""Validation per problem from a run's store: each validation step's reward per problem, split by
the problem's source (gsm8k, gsm8k-hard, ...), each validation against the one before it, and the
`--outcomes` CSV a run record keeps of them (for pairing runs whose stores were not kept)."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterator, Mapping

from calcx.contract.labels import origin_of, scored_reward
from calcx.runs.versus import Outcomes, accuracy_cell, paired_change
from calcx.server.store.reader import StoreReader

UNKNOWN_SOURCE = "unknown"
OUTCOMES_HEADER = "step,id,source,reward\n"


def _validation_rows(store: StoreReader) -> Iterator[tuple[int, dict, str, object]]:
    """(step, row, state, reward) of each rollout the trainer made for validation, whose row has an id."""
    for spec_text, state, reward in store.rollout_specs():
        spec = json.loads(spec_text)
        origin = origin_of(spec.get("labels") or {})
        row = spec.get("row") or {}
        if origin is not None and origin[0] == "val" and row.get("id") is not None:
            yield origin[1], row, state, reward


def validation_outcomes(store: StoreReader) -> dict[int, dict[str, float]]:
    """Per validation step, each problem's reward (its Calc-X row id -> reward; the mean where a row
    had several sessions), from the store's rollouts labelled partition `val` (one store holds one
    run). A rollout that did not succeed with a reward is an infrastructure failure, not a wrong
    answer: left out, as is one whose row has no id (nothing to pair it by)."""
    rewards: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for step, row, state, reward in _validation_rows(store):
        scored = scored_reward(state, reward)
        if scored is not None:
            rewards[step][str(row["id"])].append(scored)
    return {
        step: {row: statistics.mean(values) for row, values in rows.items()} for step, rows in sorted(rewards.items())
    }


def validation_sources(store: StoreReader) -> dict[str, str]:
    """Each validation problem's source (its Calc-X row id -> the row's `source`, e.g. gsm8k or
    gsm8k-hard), from the same rollouts `validation_outcomes` reads."""
    return {str(row["id"]): str(row.get("source") or UNKNOWN_SOURCE) for _, row, _, _ in _validation_rows(store)}


def split_by_source(
    outcomes: Mapping[int, Outcomes], sources: Mapping[str, str]
) -> dict[str, dict[int, dict[str, float]]]:
    """The outcomes of each source apart ({source: {step: {row: reward}}}), sources in name order."""
    split: dict[str, dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for step, rows in outcomes.items():
        for row, reward in rows.items():
            split[sources.get(row, UNKNOWN_SOURCE)][step][row] = reward
    return {source: dict(steps) for source, steps in sorted(split.items())}


def validation_table(outcomes: Mapping[int, Outcomes]) -> str:
    """Each validation's accuracy (standard error) and what changed since the validation before."""
    lines = [
        "| step | problems | accuracy (SE) | problems in both | better now | " "worse now | change (paired SE) |",
        "|" + "---:|" * 7,
    ]
    previous: Outcomes | None = None
    for step, rows in outcomes.items():
        since = ["-"] * 4 if previous is None else [str(cell) for cell in paired_change(previous, rows)]
        cells = [str(len(rows)), accuracy_cell(rows)] + since
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
        previous = rows
    return "\n".join(lines)


def outcomes_csv(outcomes: Mapping[int, Outcomes], sources: Mapping[str, str]) -> str:
    """Each validation problem's reward per step as `step,id,source,reward` lines."""
    return OUTCOMES_HEADER + "".join(
        f"{step},{row},{sources.get(row, UNKNOWN_SOURCE)},{reward:g}\n"
        for step, rows in outcomes.items()
        for row, reward in sorted(rows.items())
    )
