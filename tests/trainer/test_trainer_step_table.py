"""`src/gpu/step_table.py` reads the evicted-groups counter under the name verl 0.9.1 gives it.

verl's sync replay buffer evicts a failed GRPO group that holds no trajectory (every calcx session
raised) and reports it as `training/rollout_failure/evicted_samples`; the step table of a GPU run
must show that count, not 0. No services: verl's buffer over the in-memory TransferQueue stand-in.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
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
    """The agent table reads the store with `calcx.trainer.rollouts.tool_use` (the trainer's own counting):
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
    for n in range(4):
        con.execute("insert into rollouts (rollout_id, spec, state, latest_attempt, created_at) "
                    "values (?, '{}', 'SUCCEEDED', 1, 0)", (f"calcx-train-s1-u-{n}",))
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
                             "calcx/train/tool_calls_per_rollout": 0.5, "calcx/train/equal_reward_groups": 0.4,
                             "actor/entropy": 0.3121}}]) + "\n")
    table = _step_table().tool_use_table(_step_table().read_metrics(log)).splitlines()
    assert table[0].startswith("| step | equal-reward groups | entropy | train tool use |")
    assert [c.strip() for c in table[2].strip("|").split("|")] == ["0", "-", "-", "-", "-", "-", "10%", "-", "3"]
    assert [c.strip() for c in table[3].strip("|").split("|")] == ["1", "40%", "0.312", "25%", "0.50", "-", "-", "-", "-"]
    assert _step_table().tool_use_table({1: {"timing_s/step": 2.0}}) == ""


def test_step_table_splits_the_gpus_wait_and_keeps_a_resumed_step_apart(tmp_path: Path) -> None:
    """Where the generation phase had no call in vLLM, from the store's clocks: agents starting
    (first rollout created -> first call sent), gaps between calls, the last answer -> the last
    attempt finished, and verl's own time around that window. A step a killed run began and the
    resumed run made again counts only the resumed run's rollouts (those the ledger kept)."""
    import sqlite3

    db = tmp_path / "calcx.db"
    con = sqlite3.connect(db)
    con.executescript(_store_schema())

    def rollout(rid: str, created: float, finished: float) -> None:
        con.execute("insert into rollouts (rollout_id, spec, state, latest_attempt, created_at) "
                    "values (?, '{}', 'SUCCEEDED', 1, ?)", (rid, created))
        con.execute("insert into attempts (rollout_id, attempt_no, state, created_at, finished_at) "
                    "values (?, 1, 'SUCCEEDED', ?, ?)", (rid, created, finished))

    def call(rid: str, start: float, end: float) -> None:
        con.execute("insert into calls (rollout_id, attempt_no, seq, request, response, prompt_token_ids, "
                    "response_token_ids, response_logprobs, latency_s, status_code, created_at) "
                    "values (?, 1, 0, '{}', '{}', x'', x'', x'', ?, 200, ?)", (rid, end - start, end))

    # step 1: created at 100; calls 101-103 and 102-104, a tool gap, 105-106; finished at 106.5
    rollout("calcx-train-s1-a", 100.0, 106.5)
    rollout("calcx-train-s1-b", 100.2, 104.3)
    call("calcx-train-s1-a", 101.0, 103.0)
    call("calcx-train-s1-b", 102.0, 104.0)
    call("calcx-train-s1-a", 105.0, 106.0)
    # step 2 of a killed run (created at 200, rolled back), then the resumed run's (created at 300)
    rollout("calcx-train-s2-old", 200.0, 230.0)
    call("calcx-train-s2-old", 201.0, 229.0)
    rollout("calcx-train-s2-new", 300.0, 303.0)
    call("calcx-train-s2-new", 300.5, 302.5)
    con.executemany("insert into trained (run, step, rollout_id, attempt_no, trained_at, rolled_back_at) "
                    "values ('r', ?, ?, 1, 0, ?)",
                    [(1, "calcx-train-s1-a", None), (1, "calcx-train-s1-b", None),
                     (2, "calcx-train-s2-old", 250.0), (2, "calcx-train-s2-new", None)])
    con.commit()

    step_table = _step_table()
    waits = step_table.wait_breakdown(db)
    assert waits[1] == {"before_first_call": 1.0, "between_calls": 1.0, "after_last_call": 0.5,
                        "agents_window": 6.5, "busy": 4.0}
    assert waits[2]["busy"] == 2.0 and waits[2]["before_first_call"] == 0.5 and waits[2]["agents_window"] == 3.0
    assert step_table.busy_seconds_by_step(db) == {1: 4.0, 2: 2.0}
    assert step_table.agent_stats(db)[2]["rollouts"] == 1

    steps = {1: {"timing_s/gen": 7.0, "timing_s/step": 10.0}, 2: {"timing_s/gen": 3.5, "timing_s/step": 5.0}}
    rows = step_table.wait_table(steps, waits).splitlines()
    assert [c.strip() for c in rows[2].strip("|").split("|")] == ["1", "7.00", "4.00", "1.00", "1.00", "0.50",
                                                                   "0.50", "30%"]
    assert [c.strip() for c in rows[3].strip("|").split("|")][-1] == "30%"
    # the summary leaves out the first step (start-up inside its generation phase)
    three = {**steps, 3: {"timing_s/gen": 3.0, "timing_s/step": 10.0}}
    assert step_table.idle_summary(three, {1: 4.0, 2: 2.0, 3: 2.5}) == (
        "GPU idle waiting for agents: mean 17.5% of a step over 2 steps after the first (largest 30.0%, step 2)")
    assert step_table.idle_summary(steps, {1: 4.0}) is None
    # nor the first step of a restarted run, which pays the start-up again (calcx train's starts.jsonl)
    starts = tmp_path / "starts.jsonl"
    starts.write_text('{"first_step": 1, "checkpoint": null}\n{"first_step": 2, "checkpoint": "/c/global_step_1"}\n')
    assert step_table.restarted_steps(starts) == {2} and step_table.restarted_steps(None) == set()
    # a start sets aside the rows from its first step on: it ends the earlier starts at or after it
    with starts.open("a") as fh:
        fh.write('{"first_st')  # a line cut short by a crash while it was written
    assert step_table.restarted_steps(starts) == {2}
    for firsts, restarted in (([1, 6, 1], set()), ([1, 1], set()), ([1, 11, 6], {6}), ([1, 6, 11], {6, 11})):
        (tmp_path / "more.jsonl").write_text("".join(json.dumps({"first_step": f}) + "\n" for f in firsts))
        assert step_table.restarted_steps(tmp_path / "more.jsonl") == restarted, firsts
    assert step_table.idle_summary(three, {1: 4.0, 2: 2.0, 3: 2.5}, step_table.restarted_steps(starts)) == (
        "GPU idle waiting for agents: mean 5.0% of a step over 1 step after the first and step 2, the first "
        "after a restart (largest 5.0%, step 3)")

    # with the trainer's session times: step 1's sessions started at 99.5 and the last returned at 107.0
    sessions = tmp_path / "session_times.jsonl"
    sessions.write_text("".join(json.dumps(line) + "\n" for line in [
        {"step": 1, "partition": "train", "rollout_id": "calcx-train-s1-a", "entered": 99.5, "returned": 107.0, "ok": True},
        {"step": 1, "partition": "train", "rollout_id": "calcx-train-s1-b", "entered": 99.6, "returned": 106.9, "ok": True},
        {"step": 2, "partition": "train", "rollout_id": "calcx-train-s2-old", "entered": 150.0, "returned": 231.0,
         "ok": False},  # the killed run's session of step 2: not the step's
        {"step": 0, "partition": "val", "rollout_id": "calcx-val-s0-v", "entered": 1.0, "returned": 2.0, "ok": True}]))
    timed = step_table.wait_breakdown(db, sessions)
    assert (timed[1]["sessions_to_first_created"], timed[1]["finished_to_returned"], timed[1]["sessions_window"]) == (
        0.5, 0.5, 7.5)
    assert "sessions_window" not in timed[2]
    rows = step_table.wait_table(steps, timed).splitlines()
    assert [c.strip() for c in rows[2].strip("|").split("|")][-4:] == ["0.50", "0.50", "-0.50", "30%"]
    assert [c.strip() for c in rows[3].strip("|").split("|")][-4:] == ["-", "-", "-", "30%"]


def test_the_gpus_wait_is_never_negative() -> None:
    """Calls inside vLLM can outlast the generation phase as verl timed it (their clocks are the
    server's): the step then had no wait, not a negative one."""
    step_table = _step_table()
    m = {"timing_s/gen": 2.0, "timing_s/step": 10.0}
    assert step_table.idle_share(m, 3.0) == 0.0
    assert step_table.idle_share(m, 1.0) == 0.1
    assert step_table.idle_share({"timing_s/gen": 2.0, "timing_s/step": 0}, 1.0) is None
    assert step_table.idle_share(m, None) is None


def test_validation_per_problem_pairs_each_problem_across_steps_and_runs(tmp_path: Path) -> None:
    """Each validation's accuracy with its standard error, what changed per problem since the one
    before (paired standard error), and the same against another run's store. A failed validation
    rollout is an infrastructure failure, left out; training rollouts are not validation."""
    import math
    import sqlite3

    step_table = _step_table()

    def store(name: str, outcomes: dict[int, dict[str, str]]) -> Path:
        db = tmp_path / name
        con = sqlite3.connect(db)
        con.executescript(_store_schema())

        def insert(rid: str, row: dict, labels: dict, state: str, reward: float | None) -> None:
            con.execute("insert into rollouts (rollout_id, spec, state, latest_attempt, reward, created_at) "
                        "values (?, ?, ?, 1, ?, 0)", (rid, json.dumps({"row": row, "labels": labels}), state, reward))

        for step, rows in outcomes.items():
            for row, results in rows.items():
                for session, result in enumerate(results.split(",")):  # one result a validation session
                    # a failed rollout keeps whatever reward it last posted: still not scored
                    state, reward = ("FAILED", 1.0) if result == "failed" else ("SUCCEEDED", float(result == "right"))
                    insert(f"calcx-val-s{step}-{row}-{session}", {"id": row, "question": "q", "result": "1"},
                           {"partition": "val", "run": "r", "step": str(step)}, state, reward)
        # not validation problems that can be paired: a training rollout, a row without an id, a step
        # label that is not ASCII digits (int() would read these as 7 and fail on the second)
        insert("calcx-train-s1-a", {"id": "a", "question": "q", "result": "1"},
               {"partition": "train", "step": "1"}, "SUCCEEDED", 0.0)
        insert("calcx-val-s10-noid", {"question": "q", "result": "1"}, {"partition": "val", "step": "10"}, "SUCCEEDED", 1.0)
        insert("calcx-val-sx-a", {"id": "a"}, {"partition": "val", "step": "\u0667"}, "SUCCEEDED", 1.0)
        insert("calcx-val-sy-a", {"id": "a"}, {"partition": "val", "step": "\u00b2"}, "SUCCEEDED", 1.0)
        con.commit()
        con.close()
        return db

    mine = store("mine.db", {
        0: {"a": "right", "b": "wrong", "c": "right", "d": "wrong"},
        10: {"a": "wrong", "b": "right", "c": "right", "d": "right", "e": "failed"},
    })
    # the other run got a, b and c right at step 10 and d wrong; two sessions of c there average 0.5
    other = store("other.db", {10: {"a": "right", "b": "right", "c": "right,wrong", "d": "wrong"}})

    outcomes = step_table.validation_outcomes(mine)
    assert outcomes == {0: {"a": 1.0, "b": 0.0, "c": 1.0, "d": 0.0}, 10: {"a": 0.0, "b": 1.0, "c": 1.0, "d": 1.0}}
    assert step_table.validation_outcomes(other) == {10: {"a": 1.0, "b": 1.0, "c": 0.5, "d": 0.0}}

    def cells(text: str) -> list[list[str]]:
        return [[c.strip() for c in line.strip(" |").split("|")] for line in text.splitlines()[2:]]

    assert cells(step_table.validation_table(outcomes)) == [
        ["0", "4", f"0.500 ({math.sqrt(0.25 / 4):.3f})", "-", "-", "-", "-"],
        # b and d gained, a lost: +1/4, differences (-1, 1, 0, 1) around 0.25
        ["10", "4", f"0.750 ({math.sqrt(0.75 * 0.25 / 4):.3f})", "4", "2", "1",
         f"+0.250 ({math.sqrt((1.5625 + 0.5625 + 0.0625 + 0.5625) / 4 / 4):.3f})"],
    ]
    # only step 10 was validated by both: here (0, 1, 1, 1), there (1, 1, 0.5, 0); differences
    # (-1, 0, +0.5, +1), mean +0.125: better here on c and d, worse on a
    diffs = [-1.0, 0.0, 0.5, 1.0]
    paired_se = math.sqrt(sum((d - 0.125) ** 2 for d in diffs) / 4 / 4)
    other_se = math.sqrt(sum((x - 0.625) ** 2 for x in (1.0, 1.0, 0.5, 0.0)) / 4 / 4)
    assert cells(step_table.versus_table(outcomes, step_table.validation_outcomes(other))) == [
        ["10", "4", "0.750 (0.217)", f"0.625 ({other_se:.3f})", "2", "1", f"+0.125 ({paired_se:.3f})"],
    ]
    # a problem only one side has is left out of the pairing, not counted as a change
    shared_only = step_table.validation_table({0: {"a": 1.0, "b": 1.0}, 1: {"a": 1.0, "z": 0.0}})
    assert cells(shared_only)[1] == ["1", "2", f"0.500 ({math.sqrt(0.25 / 2):.3f})", "1", "0", "0", "+0.000 (0.000)"]

    printed = tmp_path / "metrics.jsonl"
    printed.write_text(json.dumps({"step": 1, "data": {"timing_s/step": 10.0}}) + "\n")
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        step_table.main([str(printed), "--calls", str(mine), "--versus", str(other)])
    assert "validation per problem" in out.getvalue() and f"this run against {other}" in out.getvalue()
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        step_table.main([str(printed), "--versus", str(other)])  # nothing to compare it with


def test_validation_is_split_by_source_and_kept_as_a_csv(tmp_path: Path) -> None:
    """With two validation sets (gsm8k and its hard split), the per-problem tables come for all the
    problems and for each source apart; --outcomes keeps each problem's reward per step."""
    import contextlib
    import io
    import sqlite3

    step_table = _step_table()
    db = tmp_path / "calcx.db"
    con = sqlite3.connect(db)
    con.executescript(_store_schema())
    for step, rewards in ((0, {"a": 0.0, "a-hard": 0.0, "b": 1.0}), (10, {"a": 1.0, "a-hard": 0.0, "b": 1.0})):
        for row, reward in rewards.items():
            source = "gsm8k-hard" if row.endswith("-hard") else "gsm8k"
            con.execute("insert into rollouts (rollout_id, spec, state, latest_attempt, reward, created_at) "
                        "values (?, ?, 'SUCCEEDED', 1, ?, 0)",
                        (f"calcx-val-s{step}-{row}", json.dumps({"row": {"id": row, "source": source},
                                                               "labels": {"partition": "val", "step": str(step)}}),
                         reward))
    con.commit()
    con.close()
    assert step_table.split_by_source(step_table.validation_outcomes(db), step_table.validation_sources(db)) == {
        "gsm8k": {0: {"a": 0.0, "b": 1.0}, 10: {"a": 1.0, "b": 1.0}},
        "gsm8k-hard": {0: {"a-hard": 0.0}, 10: {"a-hard": 0.0}}}
    metrics, csv = tmp_path / "metrics.jsonl", tmp_path / "validation.csv"
    metrics.write_text(json.dumps({"step": 1, "data": {"timing_s/step": 10.0}}) + "\n")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        step_table.main([str(metrics), "--calls", str(db), "--outcomes", str(csv)])
    printed = out.getvalue()
    assert "validation per problem (the store" in printed and "validation per problem (gsm8k-hard)" in printed
    assert csv.read_text().splitlines() == ["step,id,source,reward", "0,a,gsm8k,0", "0,a-hard,gsm8k-hard,0",
                                            "0,b,gsm8k,1", "10,a,gsm8k,1", "10,a-hard,gsm8k-hard,0", "10,b,gsm8k,1"]
