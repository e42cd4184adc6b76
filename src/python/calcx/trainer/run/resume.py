"""A named run started again continues from its newest whole checkpoint (docs/resume.md).

Before Ray starts: the checkpoint is chosen (`calcx.trainer.run_dir.checkpoints`: only a save that
finished counts) and handed to verl as `resume_mode: resume_path`, or `disable` when there is
none, so verl never reads its own tracker; half-written step directories after it are removed;
the report's step files (metrics, incomplete groups, tool use) keep the rows of the steps the
checkpoint holds and move the later ones to `superseded/`. Once the server answers: what the dead
run left QUEUED or RUNNING is cancelled (calcx.trainer.rollouts.leftovers) and the training ledger of the
steps after the checkpoint is rolled back, so those steps are trained again, once.

Deciding and doing are apart: `plan_resume` turns the checked settings (`ResumeSettings`) and
the saved step directories into a frozen `ResumePlan` and touches nothing; `carry_out` writes the
plan's verl keys into the config in one step, removes and moves files, and returns the
`ResumeStart` that `settle_previous_run` completes on the server.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from calcx.trainer.run_dir.checkpoints import Checkpoint, check_keep, is_complete, step_dirs
from calcx.trainer.run_dir.names import STARTS_FILE, STEP_FILES, SUPERSEDED_DIR

log = logging.getLogger(__name__)

#: the report files with one JSON object a line and a `step`: kept through the checkpoint's step
#: one line a start of the run: its first step and the checkpoint it continues from (the step table
#: leaves each start's first step, which pays the start-up, out of its wait summary); never set aside


@dataclass(frozen=True)
class ResumeSettings:
    """The keys of the run's config that resuming reads, checked before anything starts."""

    run: str
    root: Path
    mode: str
    resume_from_path: str | None = None

    @classmethod
    def from_cfg(cls, cfg: DictConfig) -> ResumeSettings:
        if OmegaConf.select(cfg, "actor_rollout_ref.actor.checkpoint.async_save", default=False):
            raise ValueError(
                "actor_rollout_ref.actor.checkpoint.async_save=true: calcx resumes only from checkpoints "
                "whose save finished, which an asynchronous save does not tell; leave it false"
            )
        for key in ("max_actor_ckpt_to_keep", "max_critic_ckpt_to_keep"):
            if OmegaConf.select(cfg, f"trainer.{key}", default=None) is not None:
                raise ValueError(
                    f"trainer.{key} is set: verl removes the older checkpoint before the newer one is "
                    "whole and forgets the checkpoints of a restarted run; use calcx.keep_checkpoints"
                )
        if OmegaConf.select(cfg, "trainer.remove_previous_ckpt_in_save", default=False):
            raise ValueError("trainer.remove_previous_ckpt_in_save=true: use calcx.keep_checkpoints=1 instead")
        check_keep(OmegaConf.select(cfg, "calcx.keep_checkpoints", default=None))
        given = OmegaConf.select(cfg, "trainer.resume_from_path", default=None)
        return cls(
            run=str(cfg.calcx.get("run") or ""),
            root=checkpoint_root(cfg),
            mode=str(cfg.trainer.resume_mode),
            resume_from_path=None if given is None else str(given),
        )


#: one saved step directory: its step, its path, whether its save finished
SavedStep = tuple[int, Path, bool]


def saved_steps(root: Path) -> tuple[SavedStep, ...]:
    """verl's step directories under `root`, oldest first, each with whether it is whole."""
    return tuple((step, path, is_complete(step, path)) for step, path in step_dirs(root))


@dataclass(frozen=True)
class ResumePlan:
    """What a start of the run will do, decided before anything is touched (carry_out does it)."""

    run: str
    root: Path
    checkpoint: Checkpoint | None
    remove: tuple[Path, ...]  # half-written step directories after the checkpoint
    keep_rows_through: int  # report rows with a later step go to superseded/ (-1: all of them)
    verl: Mapping[str, Any]  # dotted keys of verl's config -> value

    @property
    def step(self) -> int:
        """The last step the checkpoint holds (0: a fresh start)."""
        return self.checkpoint.step if self.checkpoint is not None else 0


def plan_resume(settings: ResumeSettings, saved: Sequence[SavedStep]) -> ResumePlan:
    """Choose the checkpoint (for `resume_mode: auto` the newest whole one of `saved`) and what goes
    after it. `resume_mode: disable` starts fresh; `resume_path` is verl's, taken as given."""
    verl: dict[str, Any] = {"trainer.default_local_dir": str(settings.root)}
    if settings.mode == "resume_path":
        path = Path(str(settings.resume_from_path)).expanduser().resolve()
        checkpoint: Checkpoint | None = Checkpoint(int(path.name.split("global_step_")[-1]), path)
    elif settings.mode == "auto":
        whole = [Checkpoint(step, path) for step, path, complete in saved if complete]
        checkpoint = whole[-1] if whole else None
        verl["trainer.resume_mode"] = "resume_path" if checkpoint is not None else "disable"
        verl["trainer.resume_from_path"] = str(checkpoint.path) if checkpoint is not None else None
    elif settings.mode == "disable":
        checkpoint = None
    else:
        raise ValueError(f"trainer.resume_mode={settings.mode!r}: use auto, disable or resume_path")
    if checkpoint is not None:
        verl["trainer.val_before_train"] = False  # the checkpoint's policy was validated at its own step
    after = checkpoint.step if checkpoint is not None else 0
    return ResumePlan(
        run=settings.run,
        root=settings.root,
        checkpoint=checkpoint,
        remove=tuple(path for step, path, complete in saved if step > after and not complete),
        keep_rows_through=after if checkpoint is not None else -1,
        verl=verl,
    )


@dataclass
class ResumeStart:
    """What a start of the run continued from, and what it set aside."""

    plan: ResumePlan
    removed: list[Path] = field(default_factory=list)  # half-written step directories after the checkpoint
    superseded: dict[str, int] = field(default_factory=dict)  # report file -> rows moved to superseded/
    cancelled: int = 0  # attempts the dead run left QUEUED or RUNNING
    rolled_back: list[int] = field(default_factory=list)  # steps whose training records were rolled back

    @property
    def run(self) -> str:
        return self.plan.run

    @property
    def checkpoint(self) -> Checkpoint | None:
        return self.plan.checkpoint

    @property
    def step(self) -> int:
        return self.plan.step

    def summary(self) -> str:
        start = (
            f"resuming run {self.run!r} after step {self.step} from checkpoint {self.checkpoint.path}"
            if self.checkpoint is not None
            else f"starting run {self.run!r} at step 1 (no complete checkpoint under {self.plan.root})"
        )
        parts = [
            start,
            f"{self.cancelled} rollout attempt(s) the previous run left queued or running cancelled, "
            "0 adopted (re-run steps draw new groups)",
        ]
        if self.rolled_back:
            parts.append(f"training records of step(s) {_ranges(self.rolled_back)} rolled back")
        if self.removed:
            parts.append("half-written checkpoint(s) removed: " + ", ".join(p.name for p in self.removed))
        moved = {name: n for name, n in self.superseded.items() if n}
        if moved:
            parts.append(
                "report rows after the checkpoint moved to superseded/: "
                + ", ".join(f"{name} {n}" for name, n in moved.items())
            )
        return "; ".join(parts)


def _ranges(steps: list[int]) -> str:
    return (
        f"{steps[0]}-{steps[-1]}"
        if len(steps) > 1 and steps[-1] - steps[0] == len(steps) - 1
        else ", ".join(map(str, steps))
    )


def checkpoint_root(cfg: DictConfig) -> Path:
    """`trainer.default_local_dir`, absolute (verl's driver runs in a Ray worker, not our cwd)."""
    return Path(str(cfg.trainer.default_local_dir)).expanduser().resolve()


def carry_out(plan: ResumePlan, cfg: DictConfig, report_dir: Path) -> ResumeStart:
    """Tell verl (its keys written in one `open_dict`), remove the half-written step directories,
    set the later report rows aside and record this start; the server's part is settle_previous_run."""
    with open_dict(cfg):
        for dotted, value in plan.verl.items():
            OmegaConf.update(cfg, dotted, value, merge=False, force_add=True)
    start = ResumeStart(plan=plan)
    for path in plan.remove:
        shutil.rmtree(path)
        start.removed.append(path)
    start.superseded = supersede_rows(report_dir, plan.keep_rows_through)
    record_start(report_dir, start)
    return start


def start_resume(cfg: DictConfig, report_dir: Path) -> ResumeStart:
    """Plan this start from the run's config and its saved steps, then carry the plan out."""
    settings = ResumeSettings.from_cfg(cfg)
    return carry_out(plan_resume(settings, saved_steps(settings.root)), cfg, report_dir)


def record_start(report_dir: Path, plan: ResumeStart) -> None:
    """Append this start to the run's starts file."""
    line = {
        "first_step": plan.step + 1,
        "checkpoint": str(plan.checkpoint.path) if plan.checkpoint else None,
        "at": time.time(),
    }
    report_dir.mkdir(parents=True, exist_ok=True)
    with open(report_dir / STARTS_FILE, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")


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


def settle_previous_run(server_url: str, key: str, plan: ResumeStart, owner: str | None = None) -> None:
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
