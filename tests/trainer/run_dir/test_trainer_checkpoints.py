"""A checkpoint is whole only once verl's save returned: the marker is written after it, a save
killed with SIGKILL part-way (a real process) leaves none, and the newest whole one is chosen."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from calcx.trainer.run_dir.checkpoints import is_complete, mark_after_save, newest_complete, prune_older, write_marker
from calcx.trainer.run_dir.names import CHECKPOINT_MARKER


def verl_save(root: Path, step: int) -> Path:
    """What verl 0.9.1's `_save_checkpoint` leaves for a step: actor shards, data.pt, the tracker."""
    folder = root / f"global_step_{step}"
    (folder / "actor").mkdir(parents=True, exist_ok=True)
    (folder / "actor" / "model_world_size_1_rank_0.pt").write_bytes(b"w" * 1000)
    (folder / "data.pt").write_bytes(b"d" * 10)
    (root / "latest_checkpointed_iteration.txt").write_text(str(step))
    return folder


def test_the_marker_is_written_after_the_save_returned_and_says_its_cost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trainer = SimpleNamespace(global_steps=4)
    seen: list[bool] = []

    def save() -> str:
        folder = verl_save(tmp_path, trainer.global_steps)
        seen.append((folder / CHECKPOINT_MARKER).exists())
        return "saved"

    trainer._save_checkpoint = save
    mark_after_save(trainer, lambda: tmp_path)
    assert trainer._save_checkpoint() == "saved"
    assert seen == [False]  # no marker while verl was still saving
    marker = json.loads((tmp_path / "global_step_4" / CHECKPOINT_MARKER).read_text())
    assert (
        f"calcx train: checkpoint of step 4 complete ({marker['save_seconds']:.1f} s, {marker['files']} files, "
        f"{marker['bytes']} bytes)" in capsys.readouterr().out
    )  # on the driver's log, as the step lines are
    assert (marker["step"], marker["files"], marker["bytes"]) == (4, 2, 1010)
    assert marker["save_seconds"] >= 0
    assert newest_complete(tmp_path).step == 4  # type: ignore[union-attr]


def test_the_newest_whole_checkpoint_wins_over_newer_broken_ones(tmp_path: Path) -> None:
    for step in (2, 4, 6, 8, 10):
        verl_save(tmp_path, step)
    write_marker(tmp_path / "global_step_2", 2, 1.0)
    write_marker(tmp_path / "global_step_4", 4, 1.0)
    (tmp_path / "global_step_6" / CHECKPOINT_MARKER).write_text('{"step": 4}')  # another step's marker
    write_marker(tmp_path / "global_step_8", 8, 1.0)
    (tmp_path / "global_step_8" / "data.pt").unlink()  # a file verl writes is missing
    (tmp_path / "global_step_10" / CHECKPOINT_MARKER).write_text('{"step": 1')  # cut short
    (tmp_path / "global_step_x").mkdir()
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("")  # verl's tracker, emptied by a kill
    chosen = newest_complete(tmp_path)
    assert chosen is not None and (chosen.step, chosen.path) == (4, tmp_path / "global_step_4")
    assert [is_complete(s, tmp_path / f"global_step_{s}") for s in (2, 4, 6, 8, 10)] == [
        True,
        True,
        False,
        False,
        False,
    ]
    assert newest_complete(tmp_path / "absent") is None


SLOW_SAVE = """
import sys, time
from pathlib import Path
from types import SimpleNamespace
from calcx.trainer.run_dir.checkpoints import mark_after_save
root = Path(sys.argv[1])
def save():
    folder = root / "global_step_6"
    (folder / "actor").mkdir(parents=True)
    (folder / "actor" / "shard.pt").write_bytes(b"w" * 1000)
    print("saving", flush=True)
    time.sleep(60)  # the rest of a large save
    (folder / "data.pt").write_bytes(b"d")
trainer = SimpleNamespace(global_steps=6, _save_checkpoint=save)
mark_after_save(trainer, lambda: root)
trainer._save_checkpoint()
"""


def test_a_save_killed_part_way_is_never_chosen(tmp_path: Path) -> None:
    verl_save(tmp_path, 4)
    write_marker(tmp_path / "global_step_4", 4, 1.0)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_SAVE, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "saving"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert (tmp_path / "global_step_6" / "actor" / "shard.pt").exists()
    assert not (tmp_path / "global_step_6" / CHECKPOINT_MARKER).exists()
    chosen = newest_complete(tmp_path)
    assert chosen is not None and chosen.step == 4


def test_a_whole_save_removes_what_is_older_than_the_newest_kept_ones_across_restarts(tmp_path: Path) -> None:
    # steps 2 and 4 were saved by a trainer that died; 5 is its half-written save; this trainer saves 6
    for step in (2, 4):
        write_marker(verl_save(tmp_path, step), step, 1.0)
    (tmp_path / "global_step_5" / "actor").mkdir(parents=True)
    trainer = SimpleNamespace(global_steps=6)
    trainer._save_checkpoint = lambda: verl_save(tmp_path, trainer.global_steps)
    mark_after_save(trainer, lambda: tmp_path, keep=2)
    trainer._save_checkpoint()
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [
        "global_step_4",
        "global_step_5",
        "global_step_6",
    ]
    trainer.global_steps = 8
    trainer._save_checkpoint()
    # only whole ones count toward `keep`; what is older than the oldest kept goes, whole or not
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["global_step_6", "global_step_8"]
    assert (found := newest_complete(tmp_path)) is not None and found.step == 8


def test_nothing_is_removed_while_the_newest_save_is_not_whole(tmp_path: Path) -> None:
    write_marker(verl_save(tmp_path, 3), 3, 1.0)
    verl_save(tmp_path, 6)  # no marker: a save that never returned
    assert prune_older(tmp_path, 1) == []
    assert (found := newest_complete(tmp_path)) is not None and found.step == 3
    assert prune_older(tmp_path, None) == []


@pytest.mark.parametrize("keep", [0, -1, True, 1.5, "2"])
def test_keep_must_be_a_whole_number_of_at_least_one(tmp_path: Path, keep: object) -> None:
    with pytest.raises(ValueError, match="keep_checkpoints"):
        prune_older(tmp_path, keep)  # type: ignore[arg-type]
