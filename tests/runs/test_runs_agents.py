"""The tables a run's store adds (`calcx.runs.agents`): calculator use counted as the trainer counts
it, failed attempts and policy lag per step; where the GPU waited for agents, with a resumed step's
rollouts kept apart from the killed run's; and what the calls of the rollouts left out of their
steps came back with. Each store is the server's own schema with the rows a test needs."""

from __future__ import annotations

import json
from array import array
from pathlib import Path

from run_stores import new_store

from calcx.runs import agents
from calcx.server.store.reader import StoreReader
from calcx.trainer.rollouts.tool_use import ToolUseLedger, record_tool_use, rollout_tool_use
from calcx.trainer.run_dir.names import TOOL_USE_FILE


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip(" |").split("|")]


def test_the_calls_of_left_out_rollouts_by_status_finish_reason_and_tokens(tmp_path: Path) -> None:
    """For the async run's evictions: the calls of each rollout in incomplete_groups.jsonl, by HTTP
    status, vLLM's finish reason and whether any response token came, from the server's store."""
    con = new_store(tmp_path / "calcx.db")

    def call(rid: str, seq: int, status: int, response: dict | None, tokens: list[int]) -> None:
        con.execute(
            "insert into calls (rollout_id, attempt_no, seq, request, response, prompt_token_ids, "
            "response_token_ids, response_logprobs, latency_s, policy_version, endpoint, status_code, "
            "created_at) values (?, 1, ?, '{}', ?, ?, ?, ?, 0.5, 3, 'http://r/v1', ?, 0)",
            (
                rid,
                seq,
                None if response is None else json.dumps(response).encode(),
                array("i", [1, 2]).tobytes(),
                array("i", tokens).tobytes(),
                array("d", [0.0] * len(tokens)).tobytes(),
                status,
            ),
        )

    def answer(finish: str) -> dict:
        return {"choices": [{"message": {"content": ""}, "finish_reason": finish}]}

    call("r-aborted", 0, 200, answer("stop"), [5, 6])
    call("r-aborted", 1, 200, answer("abort"), [])
    call("r-aborted-2", 0, 200, answer("abort"), [])
    call("r-upstream", 0, 502, None, [])
    call("r-kept", 0, 200, answer("abort"), [])  # not left out: not counted
    con.commit()
    incomplete = tmp_path / "incomplete_groups.jsonl"
    incomplete.write_text(
        "".join(
            json.dumps({"step": 4, "rollout_id": rid, "reason": "no_calls"}) + "\n"
            for rid in ["r-aborted", "r-aborted-2", "r-upstream", "r-none"]
        )
    )
    with StoreReader(tmp_path / "calcx.db") as store:
        lines = agents.evicted_calls(store, incomplete).splitlines()
    assert lines[0] == "4 rollouts left out; 1 of them recorded no call"
    assert [tuple(_cells(line)) for line in lines[4:]] == [
        ("200", "abort", "none", "2"),
        ("200", "stop", "some", "1"),
        ("502", "(no choice)", "none", "1"),
    ]


def test_calculator_use_failures_and_lag_are_counted_as_the_trainer_does(tmp_path: Path) -> None:
    """The agent table reads the store with `calcx.trainer.rollouts.tool_use` (the trainer's own counting):
    a successful call, a refused one, a `<tool_call>` left as text, and only the latest attempt; a
    failed attempt and a call answered by older weights than its step starts from are counted."""
    con = new_store(tmp_path / "calcx.db")

    def call(
        rid: str, attempt: int, seq: int, messages: list, message: dict, version: int = 0, status: int = 200
    ) -> None:
        con.execute(
            "insert into calls (rollout_id, attempt_no, seq, request, response, prompt_token_ids, "
            "response_token_ids, response_logprobs, latency_s, policy_version, endpoint, status_code, "
            "created_at) values (?, ?, ?, ?, ?, x'', x'', x'', 0.5, ?, 'http://r/v1', ?, 0)",
            (
                rid,
                attempt,
                seq,
                json.dumps({"messages": messages}).encode(),
                json.dumps({"choices": [{"message": message}]}).encode(),
                version,
                status,
            ),
        )

    def calc(cid: str) -> dict:
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": cid, "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "2*3"}'}}
            ],
        }

    user = {"role": "user", "content": "q"}
    call("calcx-train-s1-u-0", 1, 0, [user], calc("a"))
    call(
        "calcx-train-s1-u-0",
        1,
        1,
        [user, calc("a"), {"role": "tool", "tool_call_id": "a", "content": "6"}],
        {"role": "assistant", "content": "### ANSWER: 6 ###"},
    )
    call("calcx-train-s1-u-1", 1, 0, [user], calc("b"))
    call(
        "calcx-train-s1-u-1",
        1,
        1,
        [user, calc("b"), {"role": "tool", "tool_call_id": "b", "content": "Error executing tool calculate: bad"}],
        {"role": "assistant", "content": "### ANSWER: 6 ###"},
    )
    call("calcx-train-s1-u-2", 1, 0, [user], calc("c"))  # attempt 1 was retried: attempt 2 counts
    call("calcx-train-s1-u-2", 2, 0, [user], {"role": "assistant", "content": '<tool_call>\n{"name": </tool_call>'})
    call("calcx-train-s1-u-3", 1, 0, [user], {"role": "assistant", "content": "### ANSWER: 6 ###"})
    # step 3 starts from version 2: version 0 answering is two syncs behind; a failed call counts nothing
    call("calcx-train-s3-u-0", 1, 0, [user], {"role": "assistant", "content": "### ANSWER: 6 ###"}, version=0)
    call("calcx-train-s3-u-0", 1, 1, [user], {"role": "assistant", "content": "x"}, version=-5, status=502)
    for rid in [f"calcx-train-s1-u-{n}" for n in range(4)] + ["calcx-train-s3-u-0"]:
        con.execute(
            "insert into rollouts (rollout_id, spec, state, latest_attempt, created_at) "
            "values (?, '{}', 'SUCCEEDED', 1, 0)",
            (rid,),
        )
    con.execute(
        "insert into attempts (rollout_id, attempt_no, state, created_at) "
        "values ('calcx-train-s1-u-2', 1, 'FAILED', 0), ('calcx-train-s1-u-2', 2, 'SUCCEEDED', 0), "
        "('calcx-train-s1-u-0', 1, 'SUCCEEDED', 0), ('calcx-train-s3-u-0', 1, 'SUCCEEDED', 0), "
        "('calcx-val-s1-v', 1, 'FAILED', 0)"
    )  # a validation rollout is not a step's
    con.commit()
    with StoreReader(tmp_path / "calcx.db") as store:
        stats = agents.agent_stats(store)
    assert stats[1]["rollouts"] == 4 and stats[1]["tool_share"] == 0.25
    assert stats[1]["calls_per_rollout"] == 0.5 and stats[1]["parse_failures"] == 1
    rows = agents.agent_table(stats).splitlines()
    assert _cells(rows[2]) == ["1", "4", "25%", "-", "0.50", "1", "1", "0"]  # no row carries a chain
    assert _cells(rows[3]) == ["3", "1", "0%", "-", "0.00", "0", "0", "2"]


def test_reference_steps_computed_are_counted_from_each_rollouts_row_as_the_trainer_does(tmp_path: Path) -> None:
    """The agent table's share of the reference steps comes from the row the rollout was created with
    (its `chain`) and the trainer's own counting: the same calls give the same figure through
    `tool_use.jsonl` and the ledger the trainer logs `calcx/train/steps_computed` from."""
    con = new_store(tmp_path / "calcx.db")
    user = {"role": "user", "content": "q"}
    chain = "12 + 16 = <<12+16=28>>28 and 28 * 3 = <<28*3=84>>84"

    def rollout(rid: str, chain: str | None, answers: list[str]) -> None:
        row = {"id": rid, "question": "q", **({"chain": chain} if chain is not None else {})}
        con.execute(
            "insert into rollouts (rollout_id, spec, state, latest_attempt, created_at) "
            "values (?, ?, 'SUCCEEDED', 1, 0)",
            (rid, json.dumps({"row": row})),
        )
        calls = [
            {"id": f"c{n}", "type": "function", "function": {"name": "calculate", "arguments": "{}"}}
            for n in range(len(answers))
        ]
        first = {"role": "assistant", "content": None, "tool_calls": calls}
        tools = [{"role": "tool", "tool_call_id": f"c{n}", "content": text} for n, text in enumerate(answers)]
        for seq, (messages, message) in enumerate(
            [([user], first), ([user, first, *tools], {"role": "assistant", "content": "### ANSWER: 84 ###"})]
        ):
            con.execute(
                "insert into calls (rollout_id, attempt_no, seq, request, response, prompt_token_ids, "
                "response_token_ids, response_logprobs, latency_s, status_code, created_at) "
                "values (?, 1, ?, ?, ?, x'', x'', x'', 0.5, 200, 0)",
                (rid, seq, json.dumps({"messages": messages}), json.dumps({"choices": [{"message": message}]})),
            )

    rollout("calcx-train-s1-u-0", chain, ["28"])  # one of the two steps
    rollout("calcx-train-s1-u-1", chain, ["28", "84.0"])
    rollout("calcx-train-s1-u-2", None, ["28"])  # no chain: not in the share
    con.commit()
    with StoreReader(tmp_path / "calcx.db") as store:
        stats = agents.agent_stats(store)
        calls = list(store.answered_calls())
        rows = dict(store.rollout_rows())
    assert stats[1]["steps_computed"] == 0.75 and stats[1]["tool_share"] == 1.0
    assert _cells(agents.agent_table(stats).splitlines()[2])[:4] == ["1", "3", "100%", "75%"]
    ledger = ToolUseLedger(tmp_path / TOOL_USE_FILE)
    for rid, row in rows.items():
        use = rollout_tool_use([c for c in calls if c.rollout_id == rid], row.get("chain"))
        record_tool_use(tmp_path, partition="train", step=1, rollout_id=rid, use=use)
    assert ledger.take("train")["calcx/train/steps_computed"] == stats[1]["steps_computed"]


def _timed_store(path: Path) -> None:
    con = new_store(path)

    def rollout(rid: str, created: float, finished: float) -> None:
        con.execute(
            "insert into rollouts (rollout_id, spec, state, latest_attempt, created_at) "
            "values (?, '{}', 'SUCCEEDED', 1, ?)",
            (rid, created),
        )
        con.execute(
            "insert into attempts (rollout_id, attempt_no, state, created_at, finished_at) "
            "values (?, 1, 'SUCCEEDED', ?, ?)",
            (rid, created, finished),
        )

    def call(rid: str, start: float, end: float) -> None:
        con.execute(
            "insert into calls (rollout_id, attempt_no, seq, request, response, prompt_token_ids, "
            "response_token_ids, response_logprobs, latency_s, status_code, created_at) "
            "values (?, 1, 0, '{}', '{}', x'', x'', x'', ?, 200, ?)",
            (rid, end - start, end),
        )

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
    con.executemany(
        "insert into trained (run, step, rollout_id, attempt_no, trained_at, rolled_back_at) "
        "values ('r', ?, ?, 1, 0, ?)",
        [
            (1, "calcx-train-s1-a", None),
            (1, "calcx-train-s1-b", None),
            (2, "calcx-train-s2-old", 250.0),
            (2, "calcx-train-s2-new", None),
        ],
    )
    con.commit()
    con.close()


def test_the_gpus_wait_is_split_and_a_resumed_step_kept_apart(tmp_path: Path) -> None:
    """Where the generation phase had no call in vLLM, from the store's clocks: agents starting
    (first rollout created -> first call sent), gaps between calls, the last answer -> the last
    attempt finished, and verl's own time around that window. A step a killed run began and the
    resumed run made again counts only the resumed run's rollouts (those the ledger kept)."""
    _timed_store(tmp_path / "calcx.db")
    with StoreReader(tmp_path / "calcx.db") as store:
        waits = agents.wait_breakdown(store)
        assert agents.busy_seconds_by_step(store) == {1: 4.0, 2: 2.0}
        assert agents.agent_stats(store)[2]["rollouts"] == 1
    assert waits[1] == {
        "before_first_call": 1.0,
        "between_calls": 1.0,
        "after_last_call": 0.5,
        "agents_window": 6.5,
        "busy": 4.0,
    }
    assert waits[2]["busy"] == 2.0 and waits[2]["before_first_call"] == 0.5 and waits[2]["agents_window"] == 3.0
    steps = {1: {"timing_s/gen": 7.0, "timing_s/step": 10.0}, 2: {"timing_s/gen": 3.5, "timing_s/step": 5.0}}
    rows = agents.wait_table(steps, waits).splitlines()
    assert _cells(rows[2]) == ["1", "7.00", "4.00", "1.00", "1.00", "0.50", "0.50", "30%"]
    assert _cells(rows[3])[-1] == "30%"
    assert _cells(agents.wait_table({}, waits).splitlines()[2])[1:] == ["-", "4.00", "1.00", "1.00", "0.50", "-", "-"]


def test_the_trainers_sessions_frame_the_agents_window(tmp_path: Path) -> None:
    """With session_times.jsonl: step 1's sessions started at 99.5 and the last returned at 107.0;
    the killed run's session of step 2 and validation sessions are not the step's."""
    _timed_store(tmp_path / "calcx.db")
    sessions = tmp_path / "session_times.jsonl"
    sessions.write_text(
        "".join(
            json.dumps(line) + "\n"
            for line in [
                {
                    "step": 1,
                    "partition": "train",
                    "rollout_id": "calcx-train-s1-a",
                    "entered": 99.5,
                    "returned": 107.0,
                    "ok": True,
                },
                {
                    "step": 1,
                    "partition": "train",
                    "rollout_id": "calcx-train-s1-b",
                    "entered": 99.6,
                    "returned": 106.9,
                    "ok": True,
                },
                {
                    "step": 2,
                    "partition": "train",
                    "rollout_id": "calcx-train-s2-old",
                    "entered": 150.0,
                    "returned": 231.0,
                    "ok": False,
                },
                {
                    "step": 0,
                    "partition": "val",
                    "rollout_id": "calcx-train-s2-new",
                    "entered": 1.0,
                    "returned": 2.0,
                    "ok": True,
                },
            ]
        )
    )
    with StoreReader(tmp_path / "calcx.db") as store:
        timed = agents.wait_breakdown(store, sessions)
        assert agents.wait_breakdown(store, tmp_path / "absent.jsonl") == agents.wait_breakdown(store)
    assert (timed[1]["sessions_to_first_created"], timed[1]["finished_to_returned"], timed[1]["sessions_window"]) == (
        0.5,
        0.5,
        7.5,
    )
    assert "sessions_window" not in timed[2]
    steps = {1: {"timing_s/gen": 7.0, "timing_s/step": 10.0}, 2: {"timing_s/gen": 3.5, "timing_s/step": 5.0}}
    rows = agents.wait_table(steps, timed).splitlines()
    assert _cells(rows[2])[-4:] == ["0.50", "0.50", "-0.50", "30%"]
    assert _cells(rows[3])[-4:] == ["-", "-", "-", "30%"]
