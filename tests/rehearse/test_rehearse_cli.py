"""`calcx rehearse` as a user runs it: a real subprocess that starts and stops the whole loop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from calcx.data.generator import generate_split
from calcx.data.io import write_jsonl
from calcx.procs.procutil import descendants
from calcx.rehearse.__main__ import format_summary, summarize

SRC = Path(__file__).resolve().parents[2] / "src" / "python"


def rehearse(*args: str, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run(
        [sys.executable, "-m", "calcx.rehearse", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def test_rehearsal_runs_groups_and_reports_a_summary(tmp_path: Path) -> None:
    data = tmp_path / "rows.jsonl"
    write_jsonl(generate_split("test", 5, seed=4), data)
    before = descendants(os.getpid())
    proc = rehearse(
        "--data",
        str(data),
        "--limit",
        "3",
        "--n",
        "2",
        "--concurrency",
        "4",
        "--json",
        "--workdir",
        str(tmp_path / "work"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["rollouts"] == 6 and summary["terminal"] == 6
    assert summary["succeeded"] == 6 and summary["failed"] == 0
    assert summary["mean_reward"] == 1.0
    assert 0 < summary["latency_p50_s"] <= summary["latency_p95_s"]
    assert summary["rollouts_per_s"] > 0
    assert "succeeded     6" in proc.stderr  # the human summary goes to stderr
    assert descendants(os.getpid()) <= before  # it ended everything it started


def test_bad_input_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    missing = rehearse("--data", str(tmp_path / "nope.jsonl"), timeout=30)
    assert missing.returncode == 2 and "nope.jsonl" in missing.stderr
    bad_mode = rehearse("--generate", "1", "--mode", "sideways", timeout=30)
    assert bad_mode.returncode == 2 and "valid modes" in bad_mode.stderr


def test_summary_counts_failures_by_reason() -> None:
    from calcx.api.models import Rollout

    def rollout(rid: str, state: str, reason: str | None, reward: float | None) -> Rollout:
        attempt = {
            "attempt_id": "1",
            "state": state,
            "created_at": 0.0,
            "started_at": 1.0,
            "finished_at": 3.0,
            "reason": reason,
        }
        return Rollout.model_validate(
            {"rollout_id": rid, "row": {}, "state": state, "attempts": [attempt], "reward": reward, "created_at": 0.0}
        )

    rollouts = [
        rollout("a", "SUCCEEDED", None, 1.0),
        rollout("b", "SUCCEEDED", None, 0.0),
        rollout("c", "FAILED", "timeout", None),
        rollout("d", "FAILED", "timeout", None),
    ]
    s = summarize(rollouts, wall_s=2.0, expected=5)
    assert s["succeeded"] == 2 and s["failed"] == 2 and s["failed_by_reason"] == {"timeout": 2}
    assert s["mean_reward"] == 0.5 and s["rollouts_per_s"] == 2.0 and s["latency_p50_s"] == 3.0
    assert "timeout 2" in format_summary(s) and "4/5 terminal" in format_summary(s)


def test_no_part_the_stack_starts_gets_a_credential_or_the_key_on_its_command_line(tmp_path: Path, monkeypatch) -> None:
    from calcx.rehearse.stack import Stack, StackConfig

    credentials = {"WANDB_API_KEY": "wandb-secret", "HF_TOKEN": "hf-secret", "AWS_SECRET_ACCESS_KEY": "aws-secret"}
    for name, value in credentials.items():
        monkeypatch.setenv(name, value)
    stack = Stack(StackConfig(workdir=tmp_path / "work"))
    try:
        stack.start_server()
        stack.start_stub()  # dumpable: an agent of the same user could read its environ
        stack.start_controller()
        for part in (stack.server, stack.stub, *stack.controllers):
            assert part is not None
            environ = Path(f"/proc/{part.pid}/environ").read_bytes().split(b"\0")
            names = {item.split(b"=", 1)[0].decode() for item in environ if item}
            assert not names & set(credentials), (part.name, names & set(credentials))
            assert ("CALCX_KEY" in names) == (part is not stack.stub), part.name
            assert stack.config.key.encode() not in Path(f"/proc/{part.pid}/cmdline").read_bytes()
    finally:
        stack.stop()
