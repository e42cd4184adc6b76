"""The self-distilled warm-up's first half on CPU, real parts end to end: the sample pass
(`calcx train --eval-only --profile gsm8k-h200-sample`, the stub as the model) records several
sessions a problem at the gateway, `calcx runs traces` turns the right calculator answers of its
store into warm-up traces, and each trace tokenises as the warm-up trains it (each model turn the
agent's call, its tokens the trained ones)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from byte_tokenizer import byte_tokenizer
from live_stack import SERVICES_PYTHON, eval_only, needs_services, start_stub

from calcx.agent.answer import SYSTEM_MESSAGES
from calcx.data.generator import generate_split
from calcx.trainer.run.services import CALCX_SRC
from calcx.trainer.warmup.dataset import model_turn_segments

pytestmark = [needs_services, pytest.mark.timeout(400)]


def test_sampled_sessions_become_warm_up_traces(tmp_path: Path) -> None:
    rows = generate_split("train", 6, seed=11)
    for index, marker in [(3, "[stub:wrong] "), (4, "[stub:direct] "), (5, "[stub:badjson] ")]:
        rows[index] = {**rows[index], "question": marker + rows[index]["question"]}
    problems = tmp_path / "sample.jsonl"
    problems.write_text("".join(json.dumps(r) + "\n" for r in rows))
    held_out = tmp_path / "test.jsonl"  # the validation split: row 2 is one of its problems
    held_out.write_text(json.dumps(rows[2]) + "\n")
    stub, url = start_stub(tmp_path, rows)
    try:
        done = eval_only(tmp_path, url, problems, "--profile", "gsm8k-h200-sample")
    finally:
        stub.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    # four sampled sessions a problem, under the calculator-first message
    assert "Validation step 0: 24 scored" in (tmp_path / "run" / "eval.md").read_text()
    store = tmp_path / "run" / "services" / "calcx.db"
    out = tmp_path / "traces.parquet"
    made = subprocess.run(
        [
            SERVICES_PYTHON,
            "-m",
            "calcx.cli",
            "runs",
            "traces",
            str(store),
            "--out",
            str(out),
            "--exclude",
            str(held_out),
            "--system-message",
            "plain",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(CALCX_SRC)},
    )
    assert made.returncode == 0, made.stderr
    # the stub answers a conversation the same way each time: one trace a problem, three repeats; the
    # call with broken arguments ends in a wrong answer, the answer without a call makes no trace
    assert (
        "24 rollouts read, 2 kept, 22 left out (held_out 4, wrong_answer 8, no_calculator 4, duplicate 6)"
        in made.stderr
    ), made.stderr
    traces = pq.read_table(out).to_pylist()
    assert sorted(t["id"] for t in traces) == sorted(str(r["id"]) for r in rows[:2])
    tokenizer = byte_tokenizer()
    for trace in traces:
        messages, tools = trace["messages"], trace["tools"]
        assert messages[0] == {
            "role": "system",
            "content": SYSTEM_MESSAGES["plain"],
            "tool_calls": None,
            "tool_call_id": None,
        }
        assert [m["role"] for m in messages[1:]] == ["user", "assistant", "tool", "assistant"]
        assert messages[2]["tool_calls"][0]["function"]["name"] == "calculate" and tools
        segments = model_turn_segments(tokenizer, messages, tools)
        trained = [text for text, is_trained in segments if is_trained]
        assert len(trained) == 2 and "<tool_call>" in trained[0] and "### ANSWER:" in trained[1]
