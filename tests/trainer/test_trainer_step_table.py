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
    log.write_text(json.dumps({"step": 3, "data": {"timing_s/step": 2.0, stale_key: 27, failed_key: 1,
                                                   "perf/mfu/actor": 0.2512}}) + "\n")
    step_table = _step_table()
    rows = step_table.table(step_table.read_metrics(log), None).splitlines()
    head = [c.strip() for c in rows[0].strip(" |").split("|")]
    cells = [c.strip() for c in rows[2].strip(" |").split("|")]
    assert cells[head.index("evicted samples: stale")] == "27"
    assert cells[head.index("evicted samples: failed")] == "1"
    assert cells[head.index("update MFU")] == "25.1%"


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


def _store_schema() -> str:
    path = Path("src/python/calcx/server/store/schema.py")
    spec = importlib.util.spec_from_file_location("store_schema", path)
    assert spec is not None and spec.loader is not None, f"{path} is missing"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SCHEMA


def test_step_table_says_what_the_calls_of_left_out_rollouts_came_back_with(tmp_path: Path) -> None:
    """For the async run's evictions: the calls of each rollout in incomplete_groups.jsonl, by HTTP
    status, vLLM's finish reason and whether any response token came, from the server's store."""
    import sqlite3
    from array import array

    db = tmp_path / "calcx.db"
    con = sqlite3.connect(db)
    con.executescript(_store_schema())

    def call(rid: str, seq: int, status: int, response: dict | None, tokens: list[int]) -> None:
        con.execute("insert into calls (rollout_id, attempt_no, seq, request, response, prompt_token_ids, "
                    "response_token_ids, response_logprobs, latency_s, policy_version, endpoint, status_code, "
                    "created_at) values (?, 1, ?, '{}', ?, ?, ?, ?, 0.5, 3, 'http://r/v1', ?, 0)",
                    (rid, seq, None if response is None else json.dumps(response).encode(),
                     array("i", [1, 2]).tobytes(), array("i", tokens).tobytes(),
                     array("d", [0.0] * len(tokens)).tobytes(), status))

    def answer(finish: str) -> dict:
        return {"choices": [{"message": {"content": ""}, "finish_reason": finish}]}

    call("r-aborted", 0, 200, answer("stop"), [5, 6])
    call("r-aborted", 1, 200, answer("abort"), [])
    call("r-aborted-2", 0, 200, answer("abort"), [])
    call("r-upstream", 0, 502, None, [])
    call("r-kept", 0, 200, answer("abort"), [])  # not left out: not counted
    con.commit()
    incomplete = tmp_path / "incomplete_groups.jsonl"
    incomplete.write_text("".join(json.dumps({"step": 4, "rollout_id": rid, "reason": "no_calls"}) + "\n"
                                  for rid in ["r-aborted", "r-aborted-2", "r-upstream", "r-none"]))

    lines = _step_table().evicted_calls(db, incomplete).splitlines()
    assert lines[0] == "4 rollouts left out; 1 of them recorded no call"
    rows = {tuple(cell.strip() for cell in line.strip("|").split("|")) for line in lines[4:]}
    assert rows == {("200", "abort", "none", "2"), ("200", "stop", "some", "1"), ("502", "(no choice)", "none", "1")}


def test_step_tables_count_calculator_use_as_the_trainer_does(tmp_path: Path) -> None:
    """The agent table reads the store with `calcx.trainer.tool_use` (the trainer's own counting):
    a successful call, a refused one, a `<tool_call>` left as text, and only the latest attempt;
    the metrics file's `calcx/{train,val}/...` columns come out as logged."""
    import sqlite3
    from array import array

    db = tmp_path / "calcx.db"
    con = sqlite3.connect(db)
    con.executescript(_store_schema())

    def call(rid: str, attempt: int, seq: int, messages: list, message: dict) -> None:
        con.execute("insert into calls (rollout_id, attempt_no, seq, request, response, prompt_token_ids, "
                    "response_token_ids, response_logprobs, latency_s, policy_version, endpoint, status_code, "
                    "created_at) values (?, ?, ?, ?, ?, ?, ?, ?, 0.5, 0, 'http://r/v1', 200, 0)",
                    (rid, attempt, seq, json.dumps({"messages": messages}).encode(),
                     json.dumps({"choices": [{"message": message}]}).encode(),
                     array("i", [1]).tobytes(), array("i", [2]).tobytes(), array("d", [0.0]).tobytes()))

    def calc(cid: str) -> dict:
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "2*3"}'}}]}

    user = {"role": "user", "content": "q"}
    call("calcx-train-s1-u-0", 1, 0, [user], calc("a"))
    call("calcx-train-s1-u-0", 1, 1, [user, calc("a"), {"role": "tool", "tool_call_id": "a", "content": "6"}],
         {"role": "assistant", "content": "### ANSWER: 6 ###"})
    call("calcx-train-s1-u-1", 1, 0, [user], calc("b"))
    call("calcx-train-s1-u-1", 1, 1, [user, calc("b"), {"role": "tool", "tool_call_id": "b",
                                                         "content": "Error executing tool calculate: bad"}],
         {"role": "assistant", "content": "### ANSWER: 6 ###"})
    call("calcx-train-s1-u-2", 1, 0, [user], calc("c"))  # attempt 1 was retried: attempt 2 counts
    call("calcx-train-s1-u-2", 2, 0, [user], {"role": "assistant", "content": "<tool_call>\n{\"name\": </tool_call>"})
    call("calcx-train-s1-u-3", 1, 0, [user], {"role": "assistant", "content": "### ANSWER: 6 ###"})
    con.commit()

    stats = _step_table().agent_stats(db)
    assert stats[1]["rollouts"] == 4 and stats[1]["tool_share"] == 0.25
    assert stats[1]["calls_per_rollout"] == 0.5 and stats[1]["parse_failures"] == 1
    row = _step_table().agent_table(stats).splitlines()[2]
    assert [c.strip() for c in row.strip("|").split("|")][:5] == ["1", "4", "25%", "0.50", "1"]

    log = tmp_path / "metrics.jsonl"
    log.write_text("\n".join(json.dumps(r) for r in [
        {"step": 0, "data": {"calcx/val/tool_use": 0.1, "calcx/val/tool_parse_failures": 3.0}},
        {"step": 1, "data": {"timing_s/step": 2.0, "calcx/train/tool_use": 0.25,
                             "calcx/train/tool_calls_per_rollout": 0.5}}]) + "\n")
    table = _step_table().tool_use_table(_step_table().read_metrics(log)).splitlines()
    assert table[0].startswith("| step | train tool use |")
    assert [c.strip() for c in table[2].strip("|").split("|")] == ["0", "-", "-", "-", "10%", "-", "3"]
    assert [c.strip() for c in table[3].strip("|").split("|")] == ["1", "25%", "0.50", "-", "-", "-", "-"]
    assert _step_table().tool_use_table({1: {"timing_s/step": 2.0}}) == ""
