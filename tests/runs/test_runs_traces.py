"""A run's store -> warm-up traces (`calcx runs traces`): only rollouts scored right whose latest
attempt reached its answer through the calculator, no call refused or unparsed and the last call an
answer, become traces, each the conversation the agent sent and the answer it got; every other
rollout is counted by why it made none, held-out problems and repeated conversations included."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from run_stores import insert_call, insert_rollout, new_store

from calcx.agent.answer import SYSTEM_MESSAGES, prompt_messages
from calcx.contract.labels import CORRECT_ABOVE
from calcx.data.held_out import HeldOut
from calcx.runs.traces import store_traces

TOOLS = [{"type": "function", "function": {"name": "calculate", "parameters": {"type": "object"}}}]
VAL = {"partition": "val", "step": "0"}
SRC = Path(__file__).resolve().parents[2] / "src" / "python"


def _row(rid: str, question: str | None = None) -> dict:
    return {"id": rid, "question": question or f"question {rid}", "chain": "48/2=<<48/2=24>>24", "result": "24"}


def _call(expression: str, call_id: str = "c1") -> dict:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "calculate", "arguments": json.dumps({"expression": expression})},
    }


def _response(content: str | None, calls: list | None = None, finish: str = "stop") -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": content, "reasoning_content": None, "refusal": None}
    if calls is not None:
        message["tool_calls"] = calls
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish}]}


def _session(
    con,
    rid: str,
    row: dict,
    *,
    reward=1.0,
    state="SUCCEEDED",
    answer="24",
    tool_answer="24.0",
    first_text: str = "",
    final: str | None = None,
    finish: str = "stop",
    attempt: int = 1,
    latest: int | None = None,
    calls: bool = True,
    rollout: bool = True,
) -> None:
    """A rollout of one calculator call then an answer (or, calls=False, an answer at once);
    rollout=False records another attempt's calls of a rollout already there."""
    if rollout:
        insert_rollout(con, rid, row, VAL, state, reward, latest_attempt=latest or attempt)
    opening = prompt_messages(row["question"], "calculator-first")
    final_text = final if final is not None else f"Half of 48 is 24.\n\n### ANSWER: {answer} ###"
    if not calls:
        insert_call(con, rid, attempt, 0, {"messages": opening, "tools": TOOLS}, _response(final_text, finish=finish))
        return
    call = _call("48/2")
    insert_call(
        con, rid, attempt, 0, {"messages": opening, "tools": TOOLS}, _response(first_text, [call], "tool_calls")
    )
    history = opening + [
        {"role": "assistant", "content": first_text, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": tool_answer},
    ]
    insert_call(con, rid, attempt, 1, {"messages": history, "tools": TOOLS}, _response(final_text, finish=finish))


@pytest.fixture()
def store(tmp_path: Path) -> Path:
    path = tmp_path / "calcx.db"
    con = new_store(path)
    _session(con, "a-1", _row("a"))
    _session(con, "a-2", _row("a"))  # the same conversation again
    _session(con, "a-3", _row("a"), first_text="I halve 48.")
    _session(con, "b-1", _row("b"), reward=0.0, answer="25")
    _session(con, "c-1", _row("c"), state="FAILED")  # an infrastructure failure, whatever it posted
    _session(con, "d-1", _row("d"), calls=False)  # right in the head
    _session(con, "e-1", _row("e"), tool_answer="Error: invalid expression")
    _session(con, "f-1", _row("f"), first_text='<tool_call>{"name": broken</tool_call>')
    _session(con, "g-1", _row("g"), finish="length")
    _session(con, "h-1", _row("h"))  # held out by id
    _session(con, "i-1", _row("i", question="  the   held-out  question "))  # held out by its text
    # a retried rollout: the first attempt's calls are not its trace
    _session(con, "j-1", _row("j"), attempt=1, latest=2, first_text="first attempt")
    _session(con, "j-1", _row("j"), attempt=2, first_text="second attempt", rollout=False)
    insert_rollout(con, "k-1", {"question": "no id"}, VAL, "SUCCEEDED", 1.0)
    con.commit()
    con.close()
    return path


@pytest.fixture()
def held_out(tmp_path: Path) -> Path:
    path = tmp_path / "test.jsonl"
    rows = [{**_row("h"), "source": "gsm8k"}, {**_row("x", "the held-out question"), "source": "gsm8k"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_right_calculator_answers_become_the_conversations_the_agent_had(store: Path, held_out: Path) -> None:
    result = store_traces([store], HeldOut.read([held_out]))
    assert [t["rollout_id"] for t in result.traces] == ["a-1", "a-3", "j-1"]
    assert result.rollouts == 13 and result.problems == 2 and result.calls == 3
    assert dict(result.left_out) == {
        "duplicate": 1,
        "wrong_answer": 1,
        "not_scored": 1,
        "no_calculator": 1,
        "refused_call": 1,
        "parse_failure": 1,
        "not_closed": 1,
        "held_out": 2,
        "no_row_id": 1,
    }
    first = result.traces[0]
    assert first["id"] == "a" and first["source"] == "gsm8k" and first["tools"] == TOOLS
    # the recorded conversation and its answer, each message down to what a chat template renders
    assert first["messages"] == prompt_messages("question a", "calculator-first") + [
        {"role": "assistant", "content": None, "tool_calls": [_call("48/2")]},
        {"role": "tool", "tool_call_id": "c1", "content": "24.0"},
        {"role": "assistant", "content": "Half of 48 is 24.\n\n### ANSWER: 24 ###"},
    ]
    assert result.traces[1]["messages"][2]["content"] == "I halve 48."
    assert result.traces[2]["messages"][2]["content"] == "second attempt"


def test_a_problem_gives_at_most_per_problem_traces(store: Path, held_out: Path) -> None:
    result = store_traces([store], HeldOut.read([held_out]), per_problem=1)
    assert [t["rollout_id"] for t in result.traces] == ["a-1", "j-1"]
    assert result.left_out["over_per_problem"] == 1 and result.left_out["duplicate"] == 1
    with pytest.raises(ValueError, match="per_problem"):
        store_traces([store], HeldOut(), per_problem=0)


def test_the_system_message_may_be_the_one_rl_runs_with(store: Path, held_out: Path) -> None:
    result = store_traces([store], HeldOut.read([held_out]), system_message="plain")
    assert {t["messages"][0]["content"] for t in result.traces} == {SYSTEM_MESSAGES["plain"]}
    assert result.traces[0]["messages"][1] == prompt_messages("question a")[1]
    with pytest.raises(ValueError, match="system_message"):
        store_traces([store], HeldOut(), system_message="shout")


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "calcx.cli", "runs", "traces", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )


def test_the_command_writes_the_traces_and_counts_what_it_left_out(store: Path, held_out: Path, tmp_path: Path) -> None:
    out = tmp_path / "traces.parquet"
    done = _cli(str(store), "--out", str(out), "--exclude", str(held_out), "--system-message", "plain", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (
        "13 rollouts read, 3 kept, 10 left out (no_row_id 1, held_out 2, not_scored 1, wrong_answer 1, "
        "refused_call 1, parse_failure 1, no_calculator 1, not_closed 1, duplicate 1)" in done.stderr
    )
    assert f"wrote {out} (3 traces of 2 problems, 3 calculator calls)" in done.stdout
    rows = pq.read_table(out).to_pylist()
    assert [r["rollout_id"] for r in rows] == ["a-1", "a-3", "j-1"]
    assert rows[0]["messages"][3] == {"role": "tool", "tool_call_id": "c1", "content": "24.0", "tool_calls": None}
    # a second write needs --force; the file stays as it was
    again = _cli(str(store), "--out", str(out), "--exclude", str(held_out), cwd=tmp_path)
    assert again.returncode == 2 and "already exists; pass --force" in again.stderr


def test_the_command_refuses_what_it_cannot_do_and_writes_nothing(store: Path, held_out: Path, tmp_path: Path) -> None:
    out = tmp_path / "traces.jsonl"
    # without the held-out files a training run's store would hand its validation problems to training
    done = _cli(str(store), "--out", str(out), cwd=tmp_path)
    assert done.returncode == 2 and "--exclude" in done.stderr
    for args, said in [
        (["--out", str(tmp_path / "traces.csv")], "must end in .parquet or .jsonl"),
        (["--out", str(out), "--per-problem", "0"], "--per-problem must be at least 1"),
        (["--out", str(out), "--system-message", "shout"], "invalid choice: 'shout'"),
    ]:
        done = _cli(str(store), *args, "--exclude", str(held_out), cwd=tmp_path)
        assert done.returncode == 2 and said in done.stderr, (args, done.stderr)
    done = _cli(str(tmp_path / "absent.db"), "--out", str(out), "--exclude", str(held_out), cwd=tmp_path)
    assert done.returncode == 2 and "no store file" in done.stderr
    done = _cli(str(store), "--out", str(out), "--exclude", str(tmp_path / "absent.jsonl"), cwd=tmp_path)
    assert done.returncode == 2 and "--exclude:" in done.stderr
    # every problem held out: no trace, nothing written, exit 1
    everything = tmp_path / "all.jsonl"
    everything.write_text("".join(json.dumps({**_row(k), "source": "gsm8k"}) + "\n" for k in "abcdefghij"))
    done = _cli(str(store), "--out", str(out), "--exclude", str(everything), cwd=tmp_path)
    assert done.returncode == 1 and "no rollout made a trace" in done.stderr
    assert not out.exists()


def test_a_right_answers_bonus_counts_and_a_rollout_without_calls_or_tools_makes_no_trace(
    tmp_path: Path,
) -> None:
    """Right is a reward above CORRECT_ABOVE, the eval table's line (a tool bonus's 1.5 too); a rollout whose
    latest attempt recorded no call, or whose last request offered no tools, is counted, not kept."""
    path = tmp_path / "calcx.db"
    con = new_store(path)
    _session(con, "a-1", _row("a"), reward=1.5)  # a right answer with the tool bonus
    _session(con, "b-1", _row("b"), reward=CORRECT_ABOVE)  # not above the line: wrong
    _session(con, "e-1", _row("e"), reward=0.75)  # above it: right, as the eval table counts it
    insert_rollout(con, "c-1", _row("c"), VAL, "SUCCEEDED", 1.0)  # scored, but no call recorded
    opening = prompt_messages("question d", "calculator-first")
    history = opening + [
        {"role": "assistant", "content": "", "tool_calls": [_call("48/2")]},
        {"role": "tool", "tool_call_id": "c1", "content": "24.0"},
    ]
    insert_rollout(con, "d-1", _row("d"), VAL, "SUCCEEDED", 1.0)
    insert_call(con, "d-1", 1, 0, {"messages": opening, "tools": TOOLS}, _response("", [_call("48/2")], "tool_calls"))
    insert_call(con, "d-1", 1, 1, {"messages": history}, _response("### ANSWER: 24 ###"))  # no tools offered
    con.commit()
    con.close()
    result = store_traces([path], HeldOut())
    assert [t["rollout_id"] for t in result.traces] == ["a-1", "e-1"]
    assert dict(result.left_out) == {"wrong_answer": 1, "no_calls": 1, "unreadable_call": 1}
