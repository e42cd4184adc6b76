"""`calcx data traces`: GSM8K annotations in, the agent's chat traces out, bad annotations named.

The reference for each tool answer is the real MCP calculator the agent starts (`python -m
calcx.agent.calculator`, spoken to over stdio with MCP's own client); the reference for the
opening messages and the answer format is the agent's own code.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from calculator_client import calculator_answers

import calcx.data.__main__  # noqa: F401  (calcx.cli loads it by name; importing it here makes Pants ship it)
from calcx.agent.answer import SYSTEM_MESSAGES, build_task, extract_answer
from calcx.agent.calculator_inprocess import calculator_tool_entry
from calcx.agent.reward import reward
from calcx.cli import main
from calcx.data.traces import annotation_pairs, same_result

# Made-up problems in GSM8K's layout (the real file stays out of the repository).
GOOD = [
    {
        "question": "Ana sold 48 clips in April and half as many in May. How many in all?",
        "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\nIn all 48+24 = <<48+24=72>>72 clips.\n#### 72",
    },
    {
        "question": "Three friends share 10 dollars. How much each, to the cent?",
        "answer": "Each gets 10/3 = $<<10/3=3.33>>3.33.\n#### 3.33",
    },
    {
        "question": "A farm sells 1,000 eggs a day for 2 days. How many eggs?",
        "answer": "It sells 1000*2=<<1000*2=2000>>2000 eggs.\n#### 2,000",
    },
]
BAD = [  # (row, the reason it is skipped for)
    ({"question": "q1", "answer": "It is 48/2 = <<48/2=24 clips.\n#### 24"}, "unclosed_annotation"),
    ({"question": "q2", "answer": "It is <<48/2>>24.\n#### 24"}, "no_result"),
    ({"question": "q3", "answer": "Cost 3*$2 = <<3*$2=6>>6.\n#### 6"}, "bad_expression"),
    ({"question": "q4", "answer": "Nothing: <<5/0=0>>0.\n#### 0"}, "calculator_error"),
    ({"question": "q5", "answer": "Wrong: <<2*3=7>>7.\n#### 7"}, "result_mismatch"),
    ({"question": "q6", "answer": "Huge: <<9**9**9=1>>1.\n#### 1"}, "unbounded_power"),
    ({"question": "q7", "answer": "Ana has 5 pens.\n#### 5"}, "no_annotation"),
    ({"question": "q8", "answer": "no final line <<1+1=2>>2"}, "bad_row"),
]


def _write(path: Path) -> Path:
    rows = [GOOD[0], *[row for row, _ in BAD], *GOOD[1:]]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_traces_in_the_agents_format_with_the_calculators_answers(tmp_path: Path, capsys) -> None:
    source = _write(tmp_path / "gsm8k.jsonl")
    out = tmp_path / "traces.parquet"
    assert main(["data", "traces", str(source), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[-1] == (
        f"wrote {out} (3 traces, 4 calculator calls); 11 rows read, 3 kept, " "8 skipped"
    )
    for number, (_, reason) in enumerate(BAD, start=2):  # every bad row named by line and reason
        assert f"{source}: line {number}: {reason}" in captured.err, (reason, captured.err)

    rows = pq.read_table(out).to_pylist()
    assert [r["id"] for r in rows] == ["gsm8k-gsm8k-1", "gsm8k-gsm8k-10", "gsm8k-gsm8k-11"]
    expressions: list[str] = []
    answers: list[str] = []
    for row, good in zip(rows, GOOD):
        messages = row["messages"]
        assert row["tools"] == [calculator_tool_entry()]
        assert (messages[0]["role"], messages[0]["content"]) == ("system", SYSTEM_MESSAGES["plain"])
        assert (messages[1]["role"], messages[1]["content"]) == ("user", build_task(good["question"]))
        calling, *tool_messages, closing = messages[2:]
        assert calling["role"] == "assistant" and calling["content"] is None
        calls = calling["tool_calls"]
        assert [c["function"]["name"] for c in calls] == ["calculate"] * len(calls)
        assert [m["tool_call_id"] for m in tool_messages] == [c["id"] for c in calls]
        assert all(m["role"] == "tool" for m in tool_messages)
        expressions += [json.loads(c["function"]["arguments"])["expression"] for c in calls]
        answers += [m["content"] for m in tool_messages]
        # the closing turn: GSM8K's reasoning without the marks, then an answer the agent scores right
        assert closing["role"] == "assistant" and "<<" not in closing["content"]
        truth = good["answer"].rpartition("####")[2].strip().replace(",", "")
        assert extract_answer(closing["content"]) == truth and reward(extract_answer(closing["content"]), truth) == 1.0
    assert expressions == ["48/2", "48+24", "10/3", "1000*2"]
    assert rows[0]["messages"][-1]["content"].startswith("In May she sold 48/2 = 24 clips.\nIn all 48+24 = 72 clips.")
    assert answers == asyncio.run(calculator_answers(expressions)) == ["24.0", "72", "3.3333333333333335", "2000"]


def test_jsonl_output_and_refusals(tmp_path: Path, capsys) -> None:
    source = tmp_path / "gsm8k.jsonl"
    source.write_text(json.dumps(GOOD[0]) + "\n")
    out = tmp_path / "t.jsonl"
    assert main(["data", "traces", str(source), "--out", str(out)]) == 0
    [trace] = [json.loads(line) for line in out.read_text().splitlines()]
    assert [m["role"] for m in trace["messages"]] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert main(["data", "traces", str(source), "--out", str(out)]) == 2  # exists: --force to overwrite
    assert "already exists" in capsys.readouterr().err
    assert main(["data", "traces", str(source), "--out", str(tmp_path / "t.csv")]) == 2
    only_bad = tmp_path / "bad.jsonl"
    only_bad.write_text(json.dumps(BAD[6][0]) + "\n")
    assert main(["data", "traces", str(only_bad), "--out", str(tmp_path / "none.jsonl")]) == 1
    assert not (tmp_path / "none.jsonl").exists()


def test_annotation_rules() -> None:
    assert annotation_pairs("a <<1+2=3>>3 b <<3*4=12>>12") == [("1+2", "3"), ("3*4", "12")]
    assert same_result("3.33", "3.3333333333333335") and same_result("24", "24.0") and same_result("2,000", "2000")
    assert same_result("3.3", "3.3333333333333335")  # rounded to the one decimal it shows
    assert not same_result("3.4", "3.3333333333333335") and not same_result("7", "6") and not same_result("x", "6")


REAL_GSM8K = Path(os.environ.get("CALCX_GSM8K_FILE", "") or "/nonexistent/gsm8k/train.jsonl")


@pytest.mark.skipif(
    not REAL_GSM8K.is_file(),
    reason="needs GSM8K's train.jsonl, which the repository does not ship: set CALCX_GSM8K_FILE to a copy",
)
def test_the_real_gsm8k_train_file(tmp_path: Path, capsys) -> None:
    out = tmp_path / "traces.parquet"
    assert main(["data", "traces", str(REAL_GSM8K), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[-1] == (
        f"wrote {out} (7368 traces, 23690 calculator calls); 7473 rows read, " "7368 kept, 105 skipped"
    )
    assert "skipped 105 rows (calculator_error 10, no_annotation 95)" in captured.err


def test_held_out_rows_make_no_trace(tmp_path: Path, capsys) -> None:
    """--exclude takes the validation file `calcx data import` wrote: its problems, matched by id or
    by question text, never reach the warm-up."""
    source = tmp_path / "gsm8k.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in GOOD), encoding="utf-8")
    data = tmp_path / "data"
    assert (
        main(
            [
                "data",
                "import",
                str(source),
                "--out",
                str(data),
                "--val-size",
                "1",
                "--mini-size",
                "1",
                "--sample-size",
                "1",
            ]
        )
        == 0
    )
    [held] = pq.read_table(data / "test.parquet").to_pylist()
    capsys.readouterr()
    out = tmp_path / "traces.jsonl"
    assert main(["data", "traces", str(source), "--exclude", str(data / "test.parquet"), "--out", str(out)]) == 0
    traces = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(traces) == 2 and held["id"] not in {t["id"] for t in traces}
    assert all(held["question"] not in t["messages"][1]["content"] for t in traces)
    assert f"held_out ({held['id']} is in --exclude)" in capsys.readouterr().err
    # by question text alone: another file naming the same problem under another id
    other = tmp_path / "other.jsonl"
    other.write_text(
        json.dumps(
            {
                "id": "elsewhere-7",
                "question": "  " + held["question"].replace(" ", "  "),
                "chain": "x",
                "result": "1",
                "source": "gsm8k",
            }
        )
        + "\n",
        encoding="utf-8",
    )
    assert main(["data", "traces", str(source), "--exclude", str(other), "--out", str(out), "--force"]) == 0
    assert len(out.read_text().splitlines()) == 2
    assert (
        main(
            [
                "data",
                "traces",
                str(source),
                "--exclude",
                str(tmp_path / "missing.parquet"),
                "--out",
                str(out),
                "--force",
            ]
        )
        == 2
    )
    assert "--exclude" in capsys.readouterr().err


def test_sequential_traces_make_one_call_a_turn_each_after_the_last_result(tmp_path: Path, capsys) -> None:
    """--tool-rounds N: each annotation its own turn, answered before the next; the reasoning is cut
    at the marks, so no turn states a result its call has not returned."""
    source = tmp_path / "gsm8k.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in GOOD), encoding="utf-8")
    out = tmp_path / "traces.jsonl"
    assert main(["data", "traces", str(source), "--tool-rounds", "3", "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"wrote {out} (3 traces, 4 calculator calls); 3 rows read, " "3 kept, 0 skipped"
    )
    traces = [json.loads(line) for line in out.read_text().splitlines()]
    messages = traces[0]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    first, first_answer, second, second_answer, closing = messages[2:]
    assert first["content"] == "In May she sold 48/2 ="
    assert second["content"] == "24 clips.\nIn all 48+24 ="  # the first result opens the turn after it
    assert closing["content"] == "72 clips.\n\n### ANSWER: 72 ###"
    for turn, answer, expression, result in (
        (first, first_answer, "48/2", "24.0"),
        (second, second_answer, "48+24", "72"),
    ):
        [tool_call] = turn["tool_calls"]
        assert json.loads(tool_call["function"]["arguments"]) == {"expression": expression}
        assert (answer["tool_call_id"], answer["content"]) == (tool_call["id"], result)
    assert "24" not in first["content"] and "72" not in second["content"]
    assert extract_answer(closing["content"]) == "72"
    # the turns' texts, joined, are GSM8K's reasoning without the marks
    joined = " ".join(m["content"] for m in messages[2::2] if m["content"])
    assert " ".join(joined.split()).startswith(
        " ".join(GOOD[0]["answer"].split("####")[0].replace("<<48/2=24>>", "").replace("<<48+24=72>>", "").split())
    )
    one_call = traces[1]["messages"][2:]
    assert [m["role"] for m in one_call] == ["assistant", "tool", "assistant"]
    assert one_call[0]["content"] == "Each gets 10/3 = $" and one_call[2]["content"].startswith("3.33.")


def test_sequential_traces_skip_rows_the_agents_rounds_cannot_hold(tmp_path: Path, capsys) -> None:
    source = tmp_path / "gsm8k.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in GOOD), encoding="utf-8")
    out = tmp_path / "traces.jsonl"
    assert main(["data", "traces", str(source), "--tool-rounds", "1", "--out", str(out)]) == 0
    one_round = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(one_round[0]["messages"][2]["tool_calls"]) == 2  # 1: today's shape, both calls at once
    capsys.readouterr()
    assert main(["data", "traces", str(source), "--tool-rounds", "16", "--out", str(out), "--force"]) == 0
    for bad in ("0", "17", "two"):
        assert main(["data", "traces", str(source), "--tool-rounds", bad, "--out", str(out), "--force"]) == 2
        assert "--tool-rounds" in capsys.readouterr().err
    many = {"question": "Count up.", "answer": "1+1=<<1+1=2>>2, 2+1=<<2+1=3>>3, 3+1=<<3+1=4>>4.\n#### 4"}
    source.write_text(json.dumps(many) + "\n" + json.dumps(GOOD[2]) + "\n", encoding="utf-8")
    assert main(["data", "traces", str(source), "--tool-rounds", "2", "--out", str(out), "--force"]) == 0
    captured = capsys.readouterr()
    assert f"{source}: line 1: too_many_rounds (3 annotations > 2 tool rounds)" in captured.err
    assert len(out.read_text().splitlines()) == 1
