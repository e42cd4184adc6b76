"""benchmarks/trace_lengths.py measures a traces file as the warm-up tokenizes it: the lengths and
trained turns its dataset class gives, and the rows past the warm-up's data.max_length."""

from __future__ import annotations

import asyncio
from pathlib import Path

from byte_tokenizer import byte_tokenizer

from benchmarks.trace_lengths import measure
from calcx.agent.calculator_inprocess import calculator_tool_entry
from calcx.data.traces import build_trace, write_traces
from calcx.trainer.warmup.dataset import tokenize_trace

SHORT = {
    "id": "gsm8k-train-1",
    "question": "Natalia sold 48 clips in April and half as many in May. How many in May?",
    "chain": "In May she sold 48/2 = <<48/2=24>>24 clips.",
    "result": "24",
}
LONG = {
    "id": "gsm8k-train-2",
    "question": "Ana has 48 clips, sells half, then buys 10. How many now?",
    "chain": "She sells 48/2 = <<48/2=24>>24.\nShe keeps 48-24 = <<48-24=24>>24.\n"
    "Then 24+10 = <<24+10=34>>34 clips.",
    "result": "34",
}


def test_lengths_turns_and_rows_past_the_bound(tmp_path: Path) -> None:
    tokenizer = byte_tokenizer()
    traces = [asyncio.run(build_trace(row, [calculator_tool_entry()], tool_rounds=8))[0] for row in (SHORT, LONG)]
    path = write_traces(traces, tmp_path / "traces.parquet")
    short, long = (len(tokenize_trace(tokenizer, t["messages"], t["tools"])[0]) for t in traces)
    assert short < long

    report = measure(str(path), tokenizer, max_length=long - 1)
    assert report["traces"] == 2
    assert report["tokens"]["p50"] == short and report["tokens"]["max"] == long
    assert report["over_max_length"] == 1 and report["over"] == ["gsm8k-train-2"]
    # one call then the answer; three calls, one a turn, then the answer
    assert report["trained_turns"] == {"2": 1, "4": 1}

    assert measure(str(path), tokenizer, max_length=long)["over_max_length"] == 0
