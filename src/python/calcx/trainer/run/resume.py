"""A named run started again continues from its newest whole checkpoint (docs/resume.md).

Before Ray starts: the checkpoint is chosen (`calcx.trainer.run_dir.checkpoints`: only a save that
finished counts) and handed to verl as `resume_mode: resume_path`, or `disable` when there is
none, so verl never reads its own tracker; half-written step directories after it are removed;
the report's step files (metrics, incomplete groups, tool use) keep the rows of the steps the
checkpoint holds and move the later ones to `superseded/`. Once the server answers: what the dead
run left QUEUED or RUNNING is cancelled (calcx.trainer.rollouts.leftovers) and the training ledger of the
steps after the checkpoint is rolled back, so those steps are trained again, once.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from calcx.trainer.run_dir.checkpoints import Checkpoint, check_keep, is_complete, newest_complete, step_dirs
from calcx.trainer.run_dir.names import STARTS_FILE, STEP_FILES, SUPERSEDED_DIR

log = logging.getLogger(__name__)

#: the report files with one JSON object a line and a `step`: kept through the checkpoint's step
#: one line a start of the run: its first step and the checkpoint it continues from (the step table
#: leaves each start's first step, which pays the start-up, out of its wait summary); never set aside


@dataclass
class ResumePlan:
    """What a start of the run continues from, and what it set aside."""

    run: str
    root: Path
    checkpoint: Checkpoint | None
    removed: list[Path] = field(default_factory=list)  # half-written step directories after the checkpoint
    superseded: dict[str, int] = field(default_factory=dict)  # report file -> rows moved to superseded/
    cancelled: int = 0  # attempts the dead run left QUEUED or RUNNING
    rolled_back: list[int] = field(default_factory=list)  # steps whose training records were rolled back

    @property
    def step(self) -> int:
        """The last step the checkpoint holds (0: a fresh start)."""
        return self.checkpoint.step if self.checkpoint is not None else 0

    def summary(self) -> str:
        start = (f"resuming run {self.run!r} after step {self.step} from checkpoint {self.checkpoint.path}"
                 if self.checkpoint is not None else
                 f"starting run {self.run!r} at step 1 (no complete checkpoint under {self.root})")
        parts = [start, f"{self.cancelled} rollout attempt(s) the previous run left queued or running cancelled, "
                        "0 adopted (re-run steps draw new groups)"]
        if self.rolled_back:
            parts.append(f"training records of step(s) {_ranges(self.rolled_back)} rolled back")
        if self.removed:
            parts.append("half-written checkpoint(s) removed: " + ", ".join(p.name for p in self.removed))
        moved = {name: n for name, n in self.superseded.items() if n}
        if moved:
            parts.append("report rows after the checkpoint moved to superseded/: "
                         + ", ".join(f"{name} {n}" for name, n in moved.items()))
        return "; ".join(parts)


def _ranges(steps: list[int]) -> str:
    return f"{steps[0]}-{steps[-1]}" if len(steps) > 1 and steps[-1] - steps[0] == len(steps) - 1 else \
        ", ".join(map(str, steps))


def checkpoint_root(cfg: DictConfig) -> Path:
    """`trainer.default_local_dir`, absolute (verl's driver runs in a Ray worker, not our cwd)."""
    return Path(str(cfg.trainer.default_local_dir)).expanduser().resolve()


def plan_resume(cfg: DictConfig, report_dir: Path) -> ResumePlan:
    """Choose the checkpoint (for `resume_mode: auto`), tell verl, and set aside what comes after it.
    `resume_mode: disable` starts fresh; `resume_path` is verl's, taken as given."""
    if OmegaConf.select(cfg, "actor_rollout_ref.actor.checkpoint.async_save", default=False):
        raise ValueError("actor_rollout_ref.actor.checkpoint.async_save=true: calcx resumes only from checkpoints "
                         "whose save finished, which an asynchronous save does not tell; leave it false")
    for key in ("max_actor_ckpt_to_keep", "max_critic_ckpt_to_keep"):
        if OmegaConf.select(cfg, f"trainer.{key}", default=None) is not None:
            raise ValueError(f"trainer.{key} is set: verl removes the older checkpoint before the newer one is whole "
                             "and forgets the checkpoints of a restarted run; use calcx.keep_checkpoints")
    if OmegaConf.select(cfg, "trainer.remove_previous_ckpt_in_save", default=False):
        raise ValueError("trainer.remove_previous_ckpt_in_save=true: use calcx.keep_checkpoints=1 instead")
    check_keep(OmegaConf.select(cfg, "calcx.keep_checkpoints", default=None))
    root = checkpoint_root(cfg)
    run = str(cfg.calcx.get("run") or "")
    mode = str(cfg.trainer.resume_mode)
    with open_dict(cfg):
        cfg.trainer.default_local_dir = str(root)
    if mode == "resume_path":
        path = Path(str(cfg.trainer.resume_from_path)).expanduser().resolve()
        checkpoint: Checkpoint | None = Checkpoint(int(path.name.split("global_step_")[-1]), path)
    elif mode == "auto":
        checkpoint = newest_complete(root)
        with open_dict(cfg):
            cfg.trainer.resume_mode = "resume_path" if checkpoint is not None else "disable"
            cfg.trainer.resume_from_path = str(checkpoint.path) if checkpoint is not None else None
    elif mode == "disable":
        checkpoint = None
    else:
        raise ValueError(f"trainer.resume_mode={mode!r}: use auto, disable or resume_path")
    plan = ResumePlan(run=run, root=root, checkpoint=checkpoint)
    if checkpoint is not None:
        with open_dict(cfg):
            cfg.trainer.val_before_train = False  # the checkpoint's policy was validated at its own step
    plan.removed = remove_incomplete_after(root, plan.step)
    plan.superseded = supersede_rows(report_dir, plan.step if checkpoint is not None else -1)
    record_start(report_dir, plan)
    return plan


def record_start(report_dir: Path, plan: ResumePlan) -> None:
    """Append this start to the run's starts file."""
    line = {"first_step": plan.step + 1, "checkpoint": str(plan.checkpoint.path) if plan.checkpoint else None,
            "at": time.time()}
    report_dir.mkdir(parents=True, exist_ok=True)
    with open(report_dir / STARTS_FILE, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")


def remove_incomplete_after(root: Path, step: int) -> list[Path]:
    """Remove the step directories after `step` whose save did not finish; the re-run writes those
    steps again (a whole one stays: only `resume_path` can name an older checkpoint)."""
    removed = []
    for later, path in step_dirs(root):
        if later > step and not is_complete(later, path):
            shutil.rmtree(path)
            removed.append(path)
    return removed


def supersede_rows(report_dir: Path, keep_through: int) -> dict[str, int]:
    """Keep each step file's rows with `step <= keep_through` (and lines without a step); append
    the others to `superseded/<file>`, so the run's files continue as one run and nothing is lost.
    Returns the rows moved per file."""
    moved: dict[str, int] = {}
    for name in STEP_FILES:
        path = report_dir / name
        if not path.exists():
            continue
        kept: list[bytes] = []
        later: list[bytes] = []
        for raw in path.read_bytes().splitlines():
            step = _step_of(raw)
            (later if step is not None and step > keep_through else kept).append(raw + b"\n")
        moved[name] = len(later)
        if not later:
            continue
        aside = report_dir / SUPERSEDED_DIR / name
        aside.parent.mkdir(parents=True, exist_ok=True)
        with open(aside, "ab") as fh:
            fh.writelines(later)
        tmp = path.with_name(f".{name}.tmp")
        tmp.write_bytes(b"".join(kept))
        tmp.replace(path)
    return moved


def _step_of(raw: bytes) -> int | None:
    try:
        step = json.loads(raw).get("step")
    except (ValueError, AttributeError):
        return None
    return int(step) if isinstance(step, int) else None


def settle_previous_run(server_url: str, key: str, plan: ResumePlan, owner: str | None = None) -> None:
    """Cancel what the previous run left QUEUED or RUNNING, roll back the ledger of the steps after
    the checkpoint, and say what this start continues from. `owner`: this start's lease of the run
    (calcx.trainer.run.run_lease), which the server checks on both writes."""
    import asyncio

    from calcx.api.client import AsyncCalcxClient
    from calcx.trainer.rollouts.leftovers import cancel_leftovers

    async def go() -> None:
        async with AsyncCalcxClient(server_url, key, timeout=30.0) as client:
            plan.cancelled = len(await cancel_leftovers(client, plan.run, owner))
            plan.rolled_back = await client.rewind(plan.run, plan.step, owner=owner)

    if plan.run:  # a run without a name has no label to find its rollouts by
        asyncio.run(go())
    print(f"calcx train: {plan.summary()}", flush=True)
