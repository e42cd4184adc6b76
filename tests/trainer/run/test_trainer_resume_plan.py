"""The resume plan alone: the checked settings and the saved step directories in, a frozen plan
out, nothing on disk read or changed (the paths below do not exist)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from calcx.trainer.run.resume import ResumeSettings, plan_resume
from calcx.trainer.run_dir.checkpoints import Checkpoint

ROOT = Path("/nowhere/ckpt")


def _step(step: int, whole: bool) -> tuple[int, Path, bool]:
    return step, ROOT / f"global_step_{step}", whole


def test_auto_resumes_from_the_newest_whole_step_and_removes_only_later_half_written_ones() -> None:
    saved = [_step(2, True), _step(3, False), _step(4, True), _step(6, False)]
    plan = plan_resume(ResumeSettings(run="r1", root=ROOT, mode="auto"), saved)
    assert plan.checkpoint == Checkpoint(4, ROOT / "global_step_4") and plan.step == 4
    assert plan.remove == (ROOT / "global_step_6",)  # step 3 is before the checkpoint: it stays
    assert plan.keep_rows_through == 4
    assert dict(plan.verl) == {
        "trainer.default_local_dir": str(ROOT),
        "trainer.resume_mode": "resume_path",
        "trainer.resume_from_path": str(ROOT / "global_step_4"),
        "trainer.val_before_train": False,
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.remove = ()  # type: ignore[misc]


def test_auto_without_a_whole_step_starts_fresh_and_sets_every_row_aside() -> None:
    plan = plan_resume(ResumeSettings(run="r1", root=ROOT, mode="auto"), [_step(2, False)])
    assert plan.checkpoint is None and plan.step == 0 and plan.keep_rows_through == -1
    assert plan.remove == (ROOT / "global_step_2",)
    assert dict(plan.verl) == {
        "trainer.default_local_dir": str(ROOT),
        "trainer.resume_mode": "disable",
        "trainer.resume_from_path": None,
    }


def test_resume_path_is_taken_as_given_and_disable_starts_fresh() -> None:
    named = ResumeSettings(run="r1", root=ROOT, mode="resume_path", resume_from_path=str(ROOT / "global_step_2"))
    plan = plan_resume(named, [_step(2, True), _step(4, True), _step(5, False)])
    assert plan.step == 2 and plan.remove == (ROOT / "global_step_5",)  # the whole step 4 stays
    assert dict(plan.verl) == {"trainer.default_local_dir": str(ROOT), "trainer.val_before_train": False}
    fresh = plan_resume(ResumeSettings(run="", root=ROOT, mode="disable"), [_step(4, True)])
    assert (
        fresh.checkpoint is None and fresh.remove == () and dict(fresh.verl) == {"trainer.default_local_dir": str(ROOT)}
    )


def test_an_unknown_resume_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="resume_mode='latest'"):
        plan_resume(ResumeSettings(run="r1", root=ROOT, mode="latest"), [])
