"""`src/gpu/step_table.py` reads the evicted-groups counter under the name verl 0.9.1 gives it.

verl's sync replay buffer evicts a failed GRPO group that holds no trajectory (every calcx session
raised) and reports it as `training/rollout_failure/evicted_samples`; the step table of a GPU run
must show that count, not 0. No services: verl's buffer over the in-memory TransferQueue stand-in.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from verl_v1_cpu import load_v1

STEP_TABLE = Path("src/gpu/step_table.py")


def _step_table():
    spec = importlib.util.spec_from_file_location("step_table", STEP_TABLE)
    assert spec is not None and spec.loader is not None, f"{STEP_TABLE} is missing"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_step_table_counts_the_groups_verl_evicted(tmp_path: Path) -> None:
    v1 = load_v1()
    kv = v1.kv
    kv.reset()
    prompt = {"is_prompt": True, "global_steps": 1}
    kv.kv_batch_put(keys=["uid-a", "uid-b", "uid-c"], partition_id="train",
                    tags=[{**prompt, "status": "finished"}, {**prompt, "status": "failure"},
                          {**prompt, "status": "failure"}])
    kv.kv_batch_put(keys=["uid-a_0_0"], partition_id="train", fields=[{}], tags=[{"status": "success"}])
    buffer = v1.replay_buffer.ReplayBuffer(
        trainer_mode="sync", trainer_config={}, max_off_policy_threshold=None, max_off_policy_strategy="drop",
        sampler_kwargs={}, refill_fn=lambda count: count, sync_refill_failed_groups=True, train_batch_size=1,
        gen_batch_size=1, poll_interval=0.01)
    batch, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=1)
    assert batch.keys == ["uid-a_0_0"]
    assert metrics == {"training/rollout_failure/evicted_samples": 2}

    # as verl's file logger writes a step's metrics
    log = tmp_path / "metrics.jsonl"
    log.write_text(json.dumps({"step": 1, "data": {"timing_s/step": 2.0, **metrics}}) + "\n")
    step_table = _step_table()
    rows = step_table.table(step_table.read_metrics(log), None).splitlines()
    assert rows[0].rstrip(" |").endswith("evicted samples")
    assert rows[2].rstrip(" |").split("|")[-1].strip() == "2"


def test_step_table_shows_verls_trajectory_staleness(tmp_path: Path) -> None:
    """The staleness column is verl's own metric, from the served versions calcx records; a log
    without it (an older run) shows "-", not 0."""
    log = tmp_path / "metrics.jsonl"
    log.write_text("\n".join(json.dumps(row) for row in [
        {"step": 1, "data": {"timing_s/step": 2.0, "training/off_policy/trajectory_staleness/max": 0}},
        {"step": 2, "data": {"timing_s/step": 2.0, "training/off_policy/trajectory_staleness/max": 1}},
        {"step": 3, "data": {"timing_s/step": 2.0}},
    ]) + "\n")
    step_table = _step_table()
    rows = step_table.table(step_table.read_metrics(log), None).splitlines()
    column = [c.strip() for c in rows[0].strip(" |").split("|")].index("trajectory staleness max")
    assert [[c.strip() for c in r.strip(" |").split("|")][column] for r in rows[2:]] == ["0", "1", "-"]
