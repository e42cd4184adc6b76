"""A CPU stand-in for verl's V1 driver inside `calcx train`, for the kill-and-resume tests.

verl's trainer needs a GPU; this process does what its driver does around calcx, with calcx's
own resume code: `start_resume` and `settle_previous_run` at start; verl's data loader
(`StatefulDataLoader` over verl's `create_rl_sampler`, position saved in `data.pt` and loaded from
the chosen checkpoint, epochs renewed as verl's `_fetch_one_gen_batch` does); each step's GRPO
groups through `run_session` (real server, controller, agents, stub model); `step()` returning
the trained batch, wrapped by `record_after_step` (the server's training ledger);
`_save_checkpoint()` writing what verl writes in verl's order (actor, data.pt, then the tracker
file rewritten in place), wrapped by `mark_after_save`; the metrics line through verl's file
logger made appending. `--kill PHASE:STEP` sends this process SIGKILL during the rollouts, the
update or the checkpoint write of that step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import uuid
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from calcx.trainer.run.resume import settle_previous_run, start_resume
from calcx.trainer.run_dir.server_key import server_key

# torch, torchdata and verl are imported once the previous run is settled (as `calcx train` settles
# it before Ray starts), so that a killed run's rollouts are still in flight when it is

PHASES = ("rollouts", "update", "checkpoint")


class Problems:
    """A map-style dataset of problem indexes."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"index": index}


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class Driver:
    def __init__(self, cfg: Any, args: argparse.Namespace, rows: list[dict[str, Any]], key: str) -> None:
        from torchdata.stateful_dataloader import StatefulDataLoader
        from verl.trainer.ppo.utils import create_rl_sampler

        self.cfg, self.args, self.rows, self.key = cfg, args, rows, key
        phase, _, step = str(args.kill or "").partition(":")
        self.kill_phase: str = phase
        self.kill_step: int = int(step) if step else -1
        self.root = Path(str(cfg.trainer.default_local_dir))
        self.train_dataloader = StatefulDataLoader(
            dataset=Problems(rows),
            batch_size=args.batch,
            num_workers=0,
            drop_last=True,
            sampler=create_rl_sampler(cfg.data, Problems(rows)),
        )
        self.train_dataloader_it: Any = None
        self.global_steps = 0

    def kill_here(self, phase: str) -> bool:
        return self.kill_phase == phase and self.kill_step == self.global_steps

    def _load_checkpoint(self) -> None:  # verl's, for resume_mode resume_path / disable
        if self.cfg.trainer.resume_mode != "resume_path":
            return
        import torch

        folder = Path(str(self.cfg.trainer.resume_from_path))
        self.global_steps = int(folder.name.split("global_step_")[-1])
        self.train_dataloader.load_state_dict(torch.load(folder / "data.pt", weights_only=False))

    def _fetch_batch(self) -> list[int]:  # verl's _fetch_one_gen_batch
        try:
            if self.train_dataloader_it is None:
                self.train_dataloader_it = iter(self.train_dataloader)
            batch = next(self.train_dataloader_it)
        except StopIteration:
            self.train_dataloader_it = iter(self.train_dataloader)
            batch = next(self.train_dataloader_it)
        return [int(i) for i in batch["index"]]

    async def _rollouts(self, problems: list[int]) -> list[str]:
        from calcx.trainer.rollouts.group import GroupSpec
        from calcx.trainer.rollouts.session import run_session

        sessions, uids = [], []
        for index in problems:
            uid = uuid.uuid4().hex  # as verl: a new GRPO group id for every prompt of every step
            uids.append(uid)
            for j in range(self.args.n):
                spec = GroupSpec(
                    uid=uid,
                    session_id=j,
                    n=self.args.n,
                    step=self.global_steps,
                    partition="train",
                    row=self.rows[index],
                    env_map=None,
                    deadline_s=60.0,
                    max_attempts=3,
                    wait_timeout_s=5.0,
                    group_timeout_s=180.0,
                    run=self.args.run,
                )
                sessions.append(
                    asyncio.ensure_future(
                        run_session(
                            spec,
                            server_url=self.args.server,
                            key=self.key,
                            report_dir=self.args.report_dir,
                            max_prompt_length=4096,
                            max_response_length=2048,
                            join_calls=True,
                        )
                    )
                )
        if self.kill_here("rollouts"):
            await self._created(uids)
            print(f"driver: step {self.global_steps}'s rollouts in flight", flush=True)
            await asyncio.sleep(self.args.kill_after_s)
            die()
        return [samples.rollout_id for samples in await asyncio.gather(*sessions)]

    async def _created(self, uids: list[str]) -> None:
        """Wait until the server holds every rollout of these groups (the sessions create them)."""
        from calcx.api.client import AsyncCalcxClient

        async with AsyncCalcxClient(self.args.server, self.key) as client:
            while True:
                counts = [len(await client.list_rollouts(group_id=uid)) for uid in uids]
                if counts == [self.args.n] * len(uids):
                    return
                await asyncio.sleep(0.05)

    def step(self) -> dict[str, Any]:
        problems = self._fetch_batch()
        rollout_ids = asyncio.run(self._rollouts(problems))
        if self.kill_here("update"):
            die()
        return {"problems": problems, "rollout_ids": rollout_ids}

    def _save_checkpoint(self) -> None:  # what verl writes, in verl's order
        import torch

        folder = self.root / f"global_step_{self.global_steps}"
        (folder / "actor").mkdir(parents=True, exist_ok=True)
        torch.save({"step": self.global_steps}, folder / "actor" / "model_world_size_1_rank_0.pt")
        torch.save(self.train_dataloader.state_dict(), folder / "data.pt")
        tracker = open(self.root / "latest_checkpointed_iteration.txt", "w")  # noqa: SIM115 - verl's in-place rewrite
        if self.kill_here("checkpoint"):
            die()  # every file written, the tracker emptied, the save not returned
        tracker.write(str(self.global_steps))
        tracker.close()

    def fit(self) -> None:
        from calcx.trainer.workers.metrics_file import appending_file_logger

        self._load_checkpoint()
        logger = appending_file_logger()("calcx", self.args.run)
        self.global_steps += 1
        while self.global_steps <= self.args.steps:
            batch = self.step()
            if self.global_steps % self.args.save_freq == 0 or self.global_steps == self.args.steps:
                self._save_checkpoint()
            logger.log({"problems": batch["problems"], "rollouts": len(batch["rollout_ids"])}, step=self.global_steps)
            self.global_steps += 1
        logger.finish()


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--server", "--key-file", "--run", "--report-dir", "--checkpoints", "--rows"):
        parser.add_argument(flag, required=True)
    for flag, default in (("--steps", 8), ("--batch", 2), ("--n", 2), ("--save-freq", 2)):
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--kill", default=None, help="PHASE:STEP, PHASE one of " + ", ".join(PHASES))
    parser.add_argument("--kill-after-s", type=float, default=0.2)
    args = parser.parse_args()
    rows = [json.loads(line) for line in Path(args.rows).read_text().splitlines() if line.strip()]
    cfg = OmegaConf.create(
        {
            "trainer": {
                "default_local_dir": args.checkpoints,
                "resume_mode": "auto",
                "resume_from_path": None,
                "experiment_name": args.run,
                "val_before_train": True,
            },
            "calcx": {"run": args.run},
            "actor_rollout_ref": {"actor": {"checkpoint": {"async_save": False}}},
            "data": {"shuffle": True, "seed": None},  # calcx's default: verl's unseeded generator
        }
    )
    report_dir = Path(args.report_dir)
    os.environ["VERL_FILE_LOGGER_PATH"] = str(report_dir / "metrics.jsonl")
    key = server_key({"key_file": args.key_file})
    plan = start_resume(cfg, report_dir)
    settle_previous_run(args.server, key, plan)
    from calcx.api.client import CalcxClient
    from calcx.trainer.run_dir.checkpoints import mark_after_save
    from calcx.trainer.workers.ledger import record_after_step, record_step

    driver = Driver(cfg, args, rows, key)
    client = CalcxClient(args.server, key)
    mark_after_save(driver, lambda: driver.root)
    record_after_step(
        driver, lambda batch: batch["rollout_ids"], lambda step, ids: record_step(client, args.run, step, ids)
    )
    driver.fit()
    print("driver: finished", flush=True)


if __name__ == "__main__":
    main()
