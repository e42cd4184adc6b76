"""The step table (`calcx runs table`, `calcx.runs.steps`) reads the evicted-groups counters under
the names verl 0.9.1 gives them.

verl's sync replay buffer evicts a failed GRPO group that holds no trajectory (every calcx session
raised) and reports it as `training/rollout_failure/evicted_samples`; the step table of a GPU run
must show that count, not 0. No services: verl's buffer over the in-memory TransferQueue stand-in.
The rest of the step table's tests are in tests/runs (no verl there).
"""

from __future__ import annotations

import json
from pathlib import Path

from verl_v1_cpu import load_v1

from calcx.runs import steps


def test_step_table_counts_the_groups_verl_evicted(tmp_path: Path) -> None:
    v1 = load_v1()
    kv = v1.kv
    kv.reset()
    prompt = {"is_prompt": True, "global_steps": 1}
    kv.kv_batch_put(
        keys=["uid-a", "uid-b", "uid-c"],
        partition_id="train",
        tags=[{**prompt, "status": "finished"}, {**prompt, "status": "failure"}, {**prompt, "status": "failure"}],
    )
    kv.kv_batch_put(keys=["uid-a_0_0"], partition_id="train", fields=[{}], tags=[{"status": "success"}])
    buffer = v1.replay_buffer.ReplayBuffer(
        trainer_mode="sync",
        trainer_config={},
        max_off_policy_threshold=None,
        max_off_policy_strategy="drop",
        sampler_kwargs={},
        refill_fn=lambda count: count,
        sync_refill_failed_groups=True,
        train_batch_size=1,
        gen_batch_size=1,
        poll_interval=0.01,
    )
    batch, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=1)
    assert batch.keys == ["uid-a_0_0"]
    assert metrics == {"training/rollout_failure/evicted_samples": 2}

    # as verl's file logger writes a step's metrics
    log = tmp_path / "metrics.jsonl"
    log.write_text(json.dumps({"step": 1, "data": {"timing_s/step": 2.0, **metrics}}) + "\n")
    rows = steps.step_table(steps.read_metrics(log), None).splitlines()
    head = [c.strip() for c in rows[0].strip(" |").split("|")]
    cells = [c.strip() for c in rows[2].strip(" |").split("|")]
    assert cells[head.index("evicted samples: failed")] == "2"
    assert cells[head.index("evicted samples: stale")] == "0"


def test_step_table_counts_staleness_evictions_apart_from_failures(tmp_path: Path) -> None:
    """Async leaves out groups older than the allowed staleness under verl's off_policy name (the
    name its metric aggregator sums); the table shows them beside the failed ones, and the MFU."""
    from verl.trainer.ppo.v1.utils import MetricsAggregator

    summed = MetricsAggregator().aggregation_rules["sum"]
    stale_key, failed_key = "training/off_policy/evicted_samples", "training/rollout_failure/evicted_samples"
    assert stale_key in summed and failed_key in summed
    log = tmp_path / "metrics.jsonl"
    log.write_text(
        json.dumps({"step": 3, "data": {"timing_s/step": 2.0, stale_key: 27, failed_key: 1, "perf/mfu/actor": 0.2512}})
        + "\n"
    )
    rows = steps.step_table(steps.read_metrics(log), None).splitlines()
    head = [c.strip() for c in rows[0].strip(" |").split("|")]
    cells = [c.strip() for c in rows[2].strip(" |").split("|")]
    assert cells[head.index("evicted samples: stale")] == "27"
    assert cells[head.index("evicted samples: failed")] == "1"
    assert cells[head.index("update MFU")] == "25.1%"
