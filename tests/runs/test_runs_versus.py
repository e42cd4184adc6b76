"""Two validations of the same problems, paired (`calcx.runs.versus`): the change is the mean of the
per-problem differences with their standard error, over the problems both hold only."""

from __future__ import annotations

import math

from calcx.runs.versus import accuracy_cell, paired_change, versus_table


def _cells(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip(" |").split("|")] for line in text.splitlines()[2:]]


def test_the_change_is_paired_over_the_shared_problems() -> None:
    before, after = {"a": 1.0, "b": 0.0, "c": 1.0, "d": 0.0, "gone": 1.0}, {"a": 0.0, "b": 1.0, "c": 1.0, "d": 1.0}
    # differences (-1, 1, 0, 1) around +0.25; "gone" is on one side only: not a change
    se = math.sqrt((1.5625 + 0.5625 + 0.0625 + 0.5625) / 4 / 4)
    assert paired_change(before, after) == (4, 2, 1, f"+0.250 ({se:.3f})")
    assert paired_change({"a": 1.0}, {"z": 0.0}) == (0, 0, 0, "-")
    assert accuracy_cell({"a": 1.0, "b": 0.0}) == f"0.500 ({math.sqrt(0.25 / 2):.3f})"


def test_the_versus_table_compares_only_the_steps_both_runs_validated() -> None:
    mine = {0: {"a": 1.0, "b": 0.0}, 10: {"a": 0.0, "b": 1.0, "c": 1.0, "d": 1.0}}
    other = {10: {"a": 1.0, "b": 1.0, "c": 0.5, "d": 0.0}, 20: {"a": 1.0}}
    # step 10: differences (-1, 0, +0.5, +1), mean +0.125: better here on c and d, worse on a
    diffs = [-1.0, 0.0, 0.5, 1.0]
    paired_se = math.sqrt(sum((d - 0.125) ** 2 for d in diffs) / 4 / 4)
    other_se = math.sqrt(sum((x - 0.625) ** 2 for x in (1.0, 1.0, 0.5, 0.0)) / 4 / 4)
    assert _cells(versus_table(mine, other)) == [
        ["10", "4", "0.750 (0.217)", f"0.625 ({other_se:.3f})", "2", "1", f"+0.125 ({paired_se:.3f})"]
    ]
    assert _cells(versus_table(mine, {})) == []
