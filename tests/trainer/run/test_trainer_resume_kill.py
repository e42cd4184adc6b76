"""Kill the trainer's driver with SIGKILL during the rollouts, during the update and during a
checkpoint write, start the same command again each time, and check from the server's records
that every rollout was trained at most once, every step's batch is whole, and no problem was
skipped or repeated within an epoch; the metrics file holds each step once.

The driver is tests/trainer/resume_driver.py (verl's own data loader and calcx's resume code around
a CPU stand-in for verl's GPU step), a real subprocess; the server, controller, agents with their
MCP calculator and the stub model are the real ones, on loopback.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from live_stack import SERVICES_PYTHON, needs_services

from calcx.contract.ready import STUB_LLM_READY
from calcx.procs.managed import ManagedProcess
from calcx.server.ledger_audit import audit
from calcx.trainer.run.services import CALCX_SRC, LocalServices, ServicesConfig
from calcx.trainer.run_dir.server_key import remove_key_file, write_key_file

pytestmark = [needs_services, pytest.mark.timeout(600)]

RUN = "resume-kill"
PROBLEMS, BATCH, N, STEPS, SAVE_FREQ = 8, 2, 2, 8, 2  # 4 steps an epoch, 2 epochs, a checkpoint every 2 steps
DRIVER = Path(__file__).parents[1] / "resume_driver.py"


@pytest.fixture
def stack(tmp_path: Path):
    from calcx.data.generator import generate_split

    rows = generate_split("train", PROBLEMS, seed=25)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = ServicesConfig(
        workdir=tmp_path / "services",
        services_python=SERVICES_PYTHON,
        services_pythonpath=[str(CALCX_SRC)],
        agent_python=SERVICES_PYTHON,
        agent_pythonpath=[str(CALCX_SRC)],
        concurrency=8,
    )
    services = LocalServices(config)
    stub = ManagedProcess(
        "stub-llm",
        [
            SERVICES_PYTHON,
            "-m",
            "calcx.stub_llm",
            "--port",
            "0",
            "--mode",
            "slow=0.3",
            "--script",
            str(tmp_path / "rows.jsonl"),
        ],
        tmp_path / "stub.log",
        {**os.environ, "PYTHONPATH": str(CALCX_SRC)},
    )
    key_file = write_key_file(services.key)
    try:
        services.start()
        stub.start(STUB_LLM_READY, 60)
        assert stub.match is not None
        from calcx.api.client import CalcxClient

        with CalcxClient(services.server_url, services.key) as client:
            client.put_models("calcx-stub", [stub.match.group(1).rstrip("/")], 0)
        yield {"work": tmp_path, "rows": rows, "services": services, "key_file": key_file}
    finally:
        stub.stop()
        services.stop()
        remove_key_file(key_file)


def drive(stack: dict[str, Any], kill: str | None, on_line: Callable[[str], None] = lambda line: None) -> str:
    """The same command each time (plus where to die); returns its output once it ended."""
    work = stack["work"]
    command = [
        sys.executable,
        str(DRIVER),
        "--server",
        stack["services"].server_url,
        "--key-file",
        str(stack["key_file"]),
        "--run",
        RUN,
        "--report-dir",
        str(work / "report"),
        "--checkpoints",
        str(work / "checkpoints"),
        "--rows",
        str(work / "rows.jsonl"),
        "--steps",
        str(STEPS),
        "--batch",
        str(BATCH),
        "--n",
        str(N),
        "--save-freq",
        str(SAVE_FREQ),
    ]
    if kill:
        command += ["--kill", kill]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    with open(work / "driver.err", "w") as err:
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            assert proc.stdout is not None
            lines = []
            for line in proc.stdout:
                lines.append(line)
                on_line(line)
            proc.wait(timeout=400)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    out = "".join(lines)
    expected = -signal.SIGKILL if kill else 0
    assert (
        proc.returncode == expected
    ), f"{kill}: rc {proc.returncode}\n{out}\n{(work / 'driver.err').read_text()[-4000:]}"
    return out


#: how `calcx train` says what a start continues from (calcx.trainer.run.resume.ResumePlan.summary)
START_LINE = ("calcx train: resuming run ", "calcx train: starting run ")


def start_line(out: str) -> str:
    (line,) = (ln for ln in out.splitlines() if ln.startswith(START_LINE))
    return line


def test_killed_at_each_phase_the_run_resumes_and_trains_each_rollout_once(stack: dict[str, Any]) -> None:
    work = stack["work"]
    controller = stack["services"].controller.pid

    def hold_controller(line: str) -> None:  # step 3's attempts stay QUEUED or RUNNING until the restart
        if line.startswith("driver: step 3's rollouts in flight"):
            os.kill(controller, signal.SIGSTOP)

    def release_controller(line: str) -> None:
        if line.startswith("calcx train: "):  # the first line a start prints: the controller may go on
            os.kill(controller, signal.SIGCONT)

    try:
        first = drive(stack, "rollouts:3", hold_controller)  # killed with step 3's groups queued and running
        assert "starting run 'resume-kill' at step 1" in start_line(first)
        second = drive(stack, "update:5", release_controller)  # step 5's rollouts finished, its update under way
    finally:
        os.kill(controller, signal.SIGCONT)
    line = start_line(second)
    assert f"after step 2 from checkpoint {work / 'checkpoints' / 'global_step_2'}" in line
    cancelled = int(line.split("; ")[1].split()[0])
    assert cancelled > 0, line  # step 3's unfinished rollouts
    third = drive(stack, "checkpoint:6")  # steps 5 and 6 trained, step 6's save cut short
    assert "after step 4 from checkpoint" in start_line(third)
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    with pytest.raises(ValueError):  # verl's own tracker was emptied by the kill: resume_mode auto would stop
        find_latest_ckpt_path(str(work / "checkpoints"))
    last = drive(stack, None)
    line = start_line(last)
    assert "after step 4 from checkpoint" in line  # not global_step_6: its save never returned
    assert "training records of step(s) 5-6 rolled back" in line
    assert "half-written checkpoint(s) removed: global_step_6" in line
    assert "driver: finished" in last

    ledger = audit(stack["services"].workdir / "calcx.db", RUN)  # what `calcx ledger` reports
    assert ledger.check(BATCH * N) == []
    assert ledger.trained_twice == []
    assert ledger.steps == [(step, BATCH * N, BATCH, BATCH * N) for step in range(1, STEPS + 1)]
    assert ledger.rolled_back == [(5, BATCH * N), (6, BATCH * N)]
    assert ledger.in_flight == 0
    # the re-run steps drew the problems the rolled-back ones had drawn; over two epochs each problem twice
    assert ledger.not_redrawn == [] and (ledger.distinct_problems, ledger.step_problems) == (PROBLEMS, STEPS * BATCH)
    with sqlite3.connect(stack["services"].workdir / "calcx.db") as db:
        # each group of a surviving step trained all n of its rollouts
        groups = db.execute(
            "SELECT json_extract(r.spec, '$.group_id'), COUNT(*) FROM trained t JOIN rollouts r USING (rollout_id) "
            "WHERE t.rolled_back_at IS NULL GROUP BY 1"
        ).fetchall()
        assert {count for _, count in groups} == {N}
        # the problems each surviving step trained, from the rollouts' rows
        questions = {row["question"]: i for i, row in enumerate(stack["rows"])}
        trained = db.execute(
            "SELECT DISTINCT t.step, json_extract(r.spec, '$.group_id'), json_extract(r.spec, '$.row.question') "
            "FROM trained t JOIN rollouts r USING (rollout_id) WHERE t.rolled_back_at IS NULL ORDER BY t.step"
        ).fetchall()
    per_step: dict[int, list[int]] = {}
    for step, _, question in trained:
        per_step.setdefault(step, []).append(questions[question])
    steps_per_epoch = PROBLEMS // BATCH
    for epoch in range(STEPS // steps_per_epoch):
        seen = [p for s in range(epoch * steps_per_epoch + 1, (epoch + 1) * steps_per_epoch + 1) for p in per_step[s]]
        assert sorted(seen) == list(range(PROBLEMS)), f"epoch {epoch + 1}: {seen}"  # none skipped, none repeated

    metrics = [json.loads(line) for line in (work / "report" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert all(sorted(m["data"]["problems"]) == sorted(per_step[m["step"]]) for m in metrics)
    superseded = [
        json.loads(line)["step"] for line in (work / "report" / "superseded" / "metrics.jsonl").read_text().splitlines()
    ]
    assert superseded == [5]  # logged by the third run before its checkpoint of step 6 was cut short
