"""Hostile final answers against the reward: bounded time, nothing executed, reward 0."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from calcx.agent.answer import extract_answer
from calcx.agent.reward import reward, scalar_are_results_same
from calcx.faults.hostile import hostile_answers

# A hostile answer is refused in milliseconds; what must never happen is a hang (9**9**9 would
# never return). 30 s is thousands of times the typical figure, so a loaded machine cannot fail it.
HANG_CEILING_S = 30.0


@pytest.mark.parametrize("name", ["import", "eval", "power", "huge"])
def test_hostile_answer_scores_zero_fast_and_runs_nothing(name: str, tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    answer = hostile_answers(canary)[name]
    message = f"Let me think. ### ANSWER: {answer} ###"
    started = time.perf_counter()
    extracted = extract_answer(message)
    value = reward(extracted, "42")
    elapsed = time.perf_counter() - started
    assert value == 0.0
    assert elapsed < HANG_CEILING_S, f"{name}: the reward took {elapsed:.2f}s"
    assert not canary.exists(), f"{name}: the answer was executed"


@pytest.mark.parametrize("truth", ["9**9**9", "__import__('os').getpid()", "1e999999", "(" * 5000 + "1" + ")" * 5000])
def test_hostile_ground_truth_does_not_hang_either(truth: str) -> None:
    started = time.perf_counter()
    assert scalar_are_results_same("12", truth) is False
    assert time.perf_counter() - started < HANG_CEILING_S


def test_ten_megabyte_message_without_the_answer_marker_is_bounded() -> None:
    message = "7 " * (5 * 1024 * 1024)
    started = time.perf_counter()
    assert reward(extract_answer(message), "7") == 0.0
    assert time.perf_counter() - started < HANG_CEILING_S


def test_right_answers_still_score_after_hostile_ones(tmp_path: Path) -> None:
    for answer in hostile_answers(tmp_path / "canary").values():
        reward(answer, "42")
    assert reward(extract_answer("### ANSWER: 42 ###"), "42") == 1.0
    assert reward("2/3", "2/3 = around 0.666667") == 1.0
