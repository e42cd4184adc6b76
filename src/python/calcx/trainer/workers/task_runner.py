"""verl 0.9.1's V1 TaskRunner with calcx's duties added: keep the server's policy version current,
look for finished rollouts more often than verl's 2 s, log the agents' calculator use with
verl's own metrics (`calcx/{train,val}/...`, from the rollouts' recorded calls:
`calcx.trainer.rollouts.tool_use`), and make a run resumable (docs/resume.md): each finished checkpoint
marked whole, each step's trained rollouts in the server's ledger, the metrics file appended to.

verl stamps each of its own samples with the weight version the vLLM replica reports; calcx's
agents reach vLLM through the server's gateway instead, so the server must be told the version.
Every weight sync in verl's V1 trainers goes through `checkpoint_manager.update_weights(step)`
(sync and colocate_async: once at start-up, then at the end of each step; colocate_async resumes
generation only after it returns). The runner makes that call publish the step as the served
policy version once the weights are in place, before any request reaches them, and publishes the
current version once the agent loop manager has registered the replicas. The gateway records
the registry's version on every call, so the trajectory staleness verl computes from
`min/max_global_steps` is measured.

Imports verl and Ray: load it only where verl is installed.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
from omegaconf import OmegaConf
from verl.trainer.main_ppo import TaskRunnerV1

from calcx.api.client import CalcxClient
from calcx.trainer.config.compose import OWNER_KEY
from calcx.trainer.rollouts.tool_use import ToolUseLedger, add_tool_use_metrics
from calcx.trainer.run_dir.checkpoints import mark_after_save
from calcx.trainer.run_dir.names import TOOL_USE_FILE
from calcx.trainer.run_dir.server_key import server_key
from calcx.trainer.workers.ledger import batch_rollout_ids, record_after_step, record_step
from calcx.trainer.workers.metrics_file import install_appending_file_logger

logger = logging.getLogger(__name__)

# verl declares its runner as a Ray actor class; this is the plain class underneath it.
_VerlTaskRunner: type = getattr(  # noqa: B009 - set by @ray.remote at run time, unknown to the type checker
    TaskRunnerV1, "__ray_metadata__"
).modified_class.__ray_actor_class__


def publish_after_weight_sync(checkpoint_manager: Any, publish: Callable[[int], None]) -> None:
    """Make `checkpoint_manager.update_weights(global_steps)` publish `global_steps` once the new
    weights are loaded. A sync without a step (validation reloads the same weights) publishes
    nothing."""
    update_weights = checkpoint_manager.update_weights

    @functools.wraps(update_weights)
    def update_then_publish(global_steps: int | None = None, *args: Any, **kwargs: Any) -> Any:
        result = update_weights(global_steps, *args, **kwargs)
        if global_steps is not None:
            publish(int(global_steps))
        return result

    checkpoint_manager.update_weights = update_then_publish


def set_replay_poll(replay_buffer: Any, seconds: float | None) -> None:
    """verl 0.9.1's replay buffer sleeps `poll_interval` (2 s, not configurable) between looks for
    a finished batch, so each rollout phase ends on that grid; calcx sets `calcx.replay_poll_s`."""
    if seconds is None:
        return
    if not seconds > 0:
        raise ValueError(f"calcx.replay_poll_s must be a positive number of seconds, not {seconds!r}")
    replay_buffer.poll_interval = float(seconds)


def transfer_queue_rollout_ids(batch: Any) -> list[str]:
    """The rollout ids of a trained batch (a KVBatchMeta), from its rows' `extra_fields` in
    TransferQueue (verl clears the rows only after the step's metrics)."""
    import transfer_queue as tq  # type: ignore[import-not-found]  # verl's GPU dependency, absent on CPU

    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
    extra = data.pop("extra_fields", None)
    return batch_rollout_ids(extra.tolist() if extra is not None else [])


def record_trained_steps(trainer: Any, config: Any) -> None:
    """Each step's trained rollouts go to the server's training ledger (calcx.trainer.workers.ledger)."""
    run = str(OmegaConf.select(config, "calcx.run", default="") or "")
    if not run:
        logger.warning("calcx.run is empty: the steps' rollouts are not recorded in the server's training ledger")
        return
    owner = str(OmegaConf.select(config, OWNER_KEY, default="") or "") or None  # the run's lease (launch)
    client = CalcxClient(str(config.calcx.server_url), server_key(config.calcx), timeout=60.0)
    record_after_step(
        trainer, transfer_queue_rollout_ids, lambda step, ids: record_step(client, run, step, ids, owner=owner)
    )


class CalcxTaskRunnerBase(_VerlTaskRunner):  # type: ignore[misc,valid-type]
    def init_agent_loop_manager(self) -> None:
        # verl's runner calls this right after the trainer (and its replay buffer) is built, before fit()
        install_appending_file_logger()  # a resumed run's metrics continue the file
        checkpoints = Path(str(self.config.trainer.default_local_dir))
        keep = OmegaConf.select(self.config, "calcx.keep_checkpoints", default=None)
        mark_after_save(self.trainer, lambda: checkpoints, keep)  # a save that returned is marked whole
        set_replay_poll(self.trainer.replay_buffer, OmegaConf.select(self.config, "calcx.replay_poll_s", default=None))
        report_dir = OmegaConf.select(self.config, "calcx.report_dir", default=None)
        if report_dir:  # the AgentLoop sessions write each rollout's tool use there
            add_tool_use_metrics(self.trainer, ToolUseLedger(Path(str(report_dir)) / TOOL_USE_FILE))
        super().init_agent_loop_manager()
        publish = getattr(self.agent_loop_manager, "publish_policy_version", None)
        if publish is None:  # verl's own agent loops (the anchor) read the version from vLLM itself
            logger.debug("%s publishes no policy versions", type(self.agent_loop_manager).__name__)
            return
        record_trained_steps(self.trainer, self.config)
        publish_after_weight_sync(self.trainer.checkpoint_manager, publish)
        publish(int(self.trainer.global_steps))  # the version loaded at start-up (or from a checkpoint)


CalcxTaskRunner = ray.remote(CalcxTaskRunnerBase)
