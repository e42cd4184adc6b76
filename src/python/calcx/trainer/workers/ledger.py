"""Tell the server which rollouts each training step trained (its training ledger).

After verl's `trainer.step()` returns, the step's update is done; the task runner reads the
batch's `calcx_rollout_id`s (every AgentLoopOutput carries its rollout's id, calcx.trainer.workers.calcx_agent_loop)
and records them as that step's. The server refuses a rollout already trained into the run's
surviving weights, so a rollout is trained at most once, and the ledger is what docs/resume.md's
query reads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from calcx.api.client import CalcxAPIError, CalcxClient

log = logging.getLogger(__name__)

ROLLOUT_ID_FIELD = "calcx_rollout_id"
#: tries of one ledger request while the server is unreachable or answers 5xx
TRIES = 5


def batch_rollout_ids(extra_fields: Iterable[Any]) -> list[str]:
    """The distinct rollout ids of a batch's rows, in order (one rollout has a row per model call;
    verl's padding rows repeat real ones)."""
    ids: dict[str, None] = {}
    for fields in extra_fields:
        rid = fields.get(ROLLOUT_ID_FIELD) if isinstance(fields, dict) else None
        if isinstance(rid, str) and rid:
            ids[rid] = None
    return list(ids)


def record_step(
    client: CalcxClient,
    run: str,
    step: int,
    rollout_ids: list[str],
    sleep: Callable[[float], None] = time.sleep,
    owner: str | None = None,
) -> int:
    """Record the step's rollouts as trainer `owner` (its lease of the run); an unreachable server
    or a 5xx is tried again (the request is idempotent), a refusal (409: trained before, or the run
    taken over by another trainer) is raised."""
    for attempt in range(1, TRIES + 1):
        try:
            return client.record_trained(run, step, rollout_ids, owner=owner)
        except CalcxAPIError as exc:
            if 0 < exc.status < 500 or attempt == TRIES:  # status 0: the server was not reached
                raise
            log.warning("calcx: recording step %d's %d rollouts failed (%s); trying again", step, len(rollout_ids), exc)
            sleep(min(2.0**attempt, 30.0))
    raise AssertionError("unreachable")


def record_after_step(
    trainer: Any, batch_ids: Callable[[Any], list[str]], record: Callable[[int, list[str]], int]
) -> None:
    """Make verl's `trainer.step(...)` record the rollouts of the batch it trained, as step
    `trainer.global_steps`, before it returns (and before the step's checkpoint is saved)."""
    step_fn: Callable[..., Any] = trainer.step

    def step_then_record(*args: Any, **kwargs: Any) -> Any:
        batch = step_fn(*args, **kwargs)
        ids = batch_ids(batch)
        if ids:
            record(int(trainer.global_steps), ids)
        else:
            log.warning("calcx: step %d's batch names no calcx rollouts; nothing recorded", trainer.global_steps)
        return batch

    trainer.step = step_then_record
