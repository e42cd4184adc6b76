"""Which verl checkpoints are whole: a marker written only after verl's save returned.

verl 0.9.1 saves a step into `{default_local_dir}/global_step_N/` (the actor's shards under
`actor/`, the data loader's position in `data.pt`), then rewrites `latest_checkpointed_iteration.txt`
in place. A trainer killed inside the save leaves a directory without some of its files, and one
killed while the tracker is rewritten leaves it empty (verl's own `resume_mode: auto` then stops
on `int(b"")`). So calcx never reads the tracker: the task runner writes `calcx_complete.json`
into the step's directory once `_save_checkpoint` has returned (written to a temporary name, made
durable, then renamed: a kill leaves either no marker or a whole one), and a resume loads the
newest directory that holds one.

calcx also keeps the number of checkpoints bounded (`calcx.keep_checkpoints`): verl's own
`max_actor_ckpt_to_keep` remembers only what the running trainer saved (a restarted one never
removes the checkpoints of the run before it) and removes the older actor right after the new
actor's shards, before the new step's save is whole, so a kill in between leaves no whole one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calcx.trainer.run_dir.names import CHECKPOINT_MARKER

STEP_DIR = re.compile(r"^global_step_(\d{1,9})$")
#: what verl's save writes into every step's directory (a critic, when there is one, beside them)
REQUIRED = ("actor", "data.pt")


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: Path


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """verl's `global_step_N` directories under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := STEP_DIR.match(p.name))]
    return sorted(found)


def is_complete(step: int, path: Path) -> bool:
    """The directory holds a marker for this very step and what verl's save writes."""
    try:
        marker = json.loads((path / CHECKPOINT_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(marker, dict) or marker.get("step") != step:
        return False
    return all((path / name).exists() for name in REQUIRED)


def newest_complete(root: Path) -> Checkpoint | None:
    """The newest whole checkpoint under `root`, or None."""
    for step, path in reversed(step_dirs(root)):
        if is_complete(step, path):
            return Checkpoint(step, path)
    return None


def directory_size(path: Path) -> tuple[int, int]:
    """(files, bytes) under `path`."""
    files = size = 0
    for folder, _, names in os.walk(path):
        for name in names:
            try:
                size += os.stat(os.path.join(folder, name)).st_size
                files += 1
            except OSError:
                continue
    return files, size


def write_marker(path: Path, step: int, seconds: float) -> dict[str, Any]:
    """Mark `path` (the step's directory, saved) complete; what the marker says: the step, the
    save's seconds, its files and bytes (the checkpoint's cost, docs/resume.md)."""
    files, size = directory_size(path)
    marker = {"step": step, "save_seconds": round(seconds, 3), "files": files, "bytes": size, "written_at": time.time()}
    tmp = path / f".{CHECKPOINT_MARKER}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(marker, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path / CHECKPOINT_MARKER)
    directory = os.open(path, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return marker


def check_keep(keep: Any) -> int | None:
    """`calcx.keep_checkpoints` as given, or a clear error: a whole number >= 1, or null (keep all)."""
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise ValueError(f"calcx.keep_checkpoints must be a whole number >= 1 or null (keep all), not {keep!r}")
    return keep


def prune_older(root: Path, keep: int | None) -> list[Path]:
    """Remove the step directories older than the newest `keep` whole checkpoints (whole or not:
    nothing resumes from them); None keeps every one. Returns what was removed, oldest first."""
    if check_keep(keep) is None:
        return []
    assert keep is not None
    whole = [step for step, path in step_dirs(root) if is_complete(step, path)]
    if len(whole) <= keep:
        return []
    oldest_kept = whole[-keep]
    removed = []
    for step, path in step_dirs(root):
        if step < oldest_kept:
            shutil.rmtree(path)
            removed.append(path)
    return removed


def mark_after_save(trainer: Any, root: Callable[[], Path], keep: int | None = None) -> None:
    """Make verl's `trainer._save_checkpoint()` write the marker once it returned (the step is
    `trainer.global_steps`, the directory `root()/global_step_N`), then remove what is older than
    the newest `keep` whole checkpoints."""
    save: Callable[[], Any] = trainer._save_checkpoint

    def save_then_mark() -> Any:
        started = time.monotonic()
        result = save()
        step = int(trainer.global_steps)
        marker = write_marker(root() / f"global_step_{step}", step, time.monotonic() - started)
        # printed, like the step lines: verl's Ray workers show a library's log records only at its level
        print(
            f"calcx train: checkpoint of step {step} complete ({marker['save_seconds']:.1f} s, "
            f"{marker['files']} files, {marker['bytes']} bytes)",
            flush=True,
        )
        removed = prune_older(root(), keep)
        if removed:
            print(
                f"calcx train: older checkpoint(s) removed (calcx.keep_checkpoints={keep}): "
                + ", ".join(p.name for p in removed),
                flush=True,
            )
        return result

    trainer._save_checkpoint = save_then_mark
