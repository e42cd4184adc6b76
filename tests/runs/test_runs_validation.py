"""Validation per problem from a run's store (`calcx.runs.validation`): each validation's accuracy
with its standard error and its change since the one before, per source, and the outcomes CSV. A
failed validation rollout is an infrastructure failure, left out; training rollouts, rows without an
id and steps that are not ASCII digits are not validation problems that can be paired."""

from __future__ import annotations

import math
from pathlib import Path

from run_stores import val_store

from calcx.runs import validation
from calcx.server.store.reader import StoreReader


def _cells(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip(" |").split("|")] for line in text.splitlines()[2:]]


def test_each_problem_is_paired_with_the_validation_before(tmp_path: Path) -> None:
    db = val_store(
        tmp_path / "mine.db",
        {
            0: {"a": "right", "b": "wrong", "c": "right", "d": "wrong"},
            10: {"a": "wrong", "b": "right", "c": "right,right", "d": "right,wrong", "e": "failed"},
        },
    )
    with StoreReader(db) as store:
        outcomes = validation.validation_outcomes(store)
    assert outcomes == {0: {"a": 1.0, "b": 0.0, "c": 1.0, "d": 0.0}, 10: {"a": 0.0, "b": 1.0, "c": 1.0, "d": 0.5}}
    # b and d gained (d by half: two sessions), a lost: differences (-1, 1, 0, 0.5) around 0.125
    diffs = [-1.0, 1.0, 0.0, 0.5]
    se = math.sqrt(sum((d - 0.125) ** 2 for d in diffs) / 4 / 4)
    acc_se = math.sqrt(sum((x - 0.625) ** 2 for x in (0.0, 1.0, 1.0, 0.5)) / 4 / 4)
    assert _cells(validation.validation_table(outcomes)) == [
        ["0", "4", f"0.500 ({math.sqrt(0.25 / 4):.3f})", "-", "-", "-", "-"],
        ["10", "4", f"0.625 ({acc_se:.3f})", "4", "2", "1", f"+0.125 ({se:.3f})"],
    ]


def test_sources_are_split_and_kept_as_a_csv(tmp_path: Path) -> None:
    db = val_store(
        tmp_path / "calcx.db",
        {0: {"a": "wrong", "a-hard": "wrong", "b": "right"}, 10: {"a": "right", "a-hard": "wrong", "b": "right"}},
    )
    with StoreReader(db) as store:
        outcomes, sources = validation.validation_outcomes(store), validation.validation_sources(store)
    assert validation.split_by_source(outcomes, sources) == {
        "gsm8k": {0: {"a": 0.0, "b": 1.0}, 10: {"a": 1.0, "b": 1.0}},
        "gsm8k-hard": {0: {"a-hard": 0.0}, 10: {"a-hard": 0.0}},
    }
    assert validation.split_by_source({0: {"x": 1.0}}, {}) == {"unknown": {0: {"x": 1.0}}}
    assert validation.outcomes_csv(outcomes, sources).splitlines() == [
        "step,id,source,reward",
        "0,a,gsm8k,0",
        "0,a-hard,gsm8k-hard,0",
        "0,b,gsm8k,1",
        "10,a,gsm8k,1",
        "10,a-hard,gsm8k-hard,0",
        "10,b,gsm8k,1",
    ]
