"""`calcx stub-llm` as a real process, script files, and argument errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from calcx.stub_llm.__main__ import main
from calcx.stub_llm.script import ScriptError, arithmetic_in, chain_expression, load_script

SRC = Path(__file__).resolve().parents[2] / "src" / "python"


def test_cli_serves_on_a_free_port_with_a_script(tmp_path):
    script = tmp_path / "script.jsonl"
    script.write_text(json.dumps({"question": "How many legs do 3 cats have?", "expression": "3 * 4"}) + "\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "calcx.stub_llm", "--port", "0", "--script", str(script)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        line = proc.stdout.readline()
        assert line.startswith("calcx stub-llm: serving on http://127.0.0.1:"), proc.stderr.read()
        base = line.split()[4]
        assert httpx.get(base.removesuffix("/v1") + "/healthz", timeout=10).json()["script_entries"] == 1
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "How many legs do 3 cats have?"}],
            "tools": [{"type": "function", "function": {"name": "calculate", "parameters": {}}}],
        }
        call = httpx.post(f"{base}/chat/completions", json=body, timeout=10).json()["choices"][0]
        assert json.loads(call["message"]["tool_calls"][0]["function"]["arguments"]) == {"expression": "3 * 4"}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)


def test_cli_rejects_unknown_mode(capsys):
    assert main(["--mode", "explode", "--port", "0"]) == 2
    assert "valid modes" in capsys.readouterr().err


def test_cli_rejects_missing_script(tmp_path, capsys):
    assert main(["--script", str(tmp_path / "nope.jsonl"), "--port", "0"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_script_row_errors_name_the_row(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q1", "expression": "1+1"}) + "\n" + json.dumps({"question": "q2"}) + "\n")
    with pytest.raises(ScriptError, match="row 2"):
        load_script([bad])


def test_script_from_calcx_parquet(tmp_path):
    from calcx.data.generator import generate_split
    from calcx.data.io import write_parquet

    rows = generate_split("test", 5, seed=3)
    path = write_parquet(rows, tmp_path / "test.parquet")
    script = load_script([path])
    assert len(script) == 5
    assert script.lookup(rows[0]["question"] + "\n\nAnswer please") == chain_expression(rows[0]["chain"])


@pytest.mark.parametrize(
    "text, expr",
    [
        ("What is 12 * (3 + 4)?", "12 * (3 + 4)"),
        ("Compute 2^10.", "2^10"),
        ("how much is 7.5 / 2.5", "7.5 / 2.5"),
        ("Tom has 3 apples.", None),
        ("[stub:wrong] What is 6 * 7?", "6 * 7"),
    ],
)
def test_arithmetic_in_question(text, expr):
    assert arithmetic_in(text) == expr
