"""`calcx runs table`: every table of a run in the order steps.md holds them, the refusals of what
needs the run's store without it, and no matplotlib on the way (the GPU machine prints these tables
while it trains; only the pictures draw)."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest
from run_stores import val_store

from calcx.cli import main


def _metrics(path: Path) -> Path:
    rows = [
        {"step": 0, "data": {"val-core/gsm8k/reward/mean@1": 0.25}},
        *(
            {"step": s, "data": {"timing_s/step": 10.0, "timing_s/gen": 4.0, "calcx/train/tool_use": 0.5}}
            for s in (1, 2, 3)
        ),
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _with_training(db: Path) -> Path:
    """One training rollout a step, each with one call of 2 s inside its 4 s generation phase."""
    con = sqlite3.connect(db)
    for step in (1, 2, 3):
        rid = f"calcx-train-s{step}-g-0"
        con.execute(
            "insert into rollouts (rollout_id, spec, state, latest_attempt, created_at) "
            "values (?, '{}', 'SUCCEEDED', 1, ?)",
            (rid, step * 100.0),
        )
        con.execute(
            "insert into attempts (rollout_id, attempt_no, state, created_at, finished_at) "
            "values (?, 1, 'SUCCEEDED', ?, ?)",
            (rid, step * 100.0, step * 100.0 + 3),
        )
        con.execute(
            "insert into calls (rollout_id, attempt_no, seq, request, response, prompt_token_ids, "
            "response_token_ids, response_logprobs, latency_s, status_code, created_at) "
            "values (?, 1, 0, '{}', '{}', x'', x'', x'', 2.0, 200, ?)",
            (rid, step * 100.0 + 2.5),
        )
    con.commit()
    con.close()
    return db


def test_the_tables_come_in_the_order_steps_md_holds_them(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    mine = _with_training(
        val_store(tmp_path / "mine.db", {0: {"a": "right", "a-hard": "wrong"}, 10: {"a": "right", "a-hard": "right"}})
    )
    other = val_store(tmp_path / "other.db", {10: {"a": "wrong", "a-hard": "right"}})
    starts, csv = tmp_path / "starts.jsonl", tmp_path / "validation.csv"
    starts.write_text('{"first_step": 1}\n{"first_step": 2}\n')
    (tmp_path / "incomplete.jsonl").write_text(json.dumps({"rollout_id": "calcx-train-s2-g-1"}) + "\n")
    assert (
        main(
            [
                "runs",
                "table",
                str(_metrics(tmp_path / "metrics.jsonl")),
                "--calls",
                str(mine),
                "--versus",
                str(other),
                "--outcomes",
                str(csv),
                "--starts",
                str(starts),
                "--incomplete",
                str(tmp_path / "incomplete.jsonl"),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    marks = [
        "| step | step s |",
        "| step | equal-reward groups |",
        "| step | rollouts |",
        "| step | rollout (gen) s | calls in vLLM s |",
        "1 rollouts left out; 1 of them recorded no call",
        "validation per problem (the store",
        "validation per problem (gsm8k)",
        "validation per problem (gsm8k-hard)",
        f"this run against {other}, the same",
        f"this run against {other} (gsm8k-hard)",
        "validation accuracy: step 0: 0.250",
        "GPU idle waiting for agents: mean 20.0% of a step over 1 step after the first and step 2",
        "mean step time after the first, nor the first after a restart: 10.00 s",
    ]
    places = [printed.find(mark) for mark in marks]
    assert -1 not in places and places == sorted(places), dict(zip(marks, places))
    assert "| 2 | 4.00 | 2.00 | 0.50 | 0.00 | 0.50 | 1.00 | 20% |" in printed
    assert csv.read_text().splitlines()[1:] == [
        "0,a,gsm8k,1",
        "0,a-hard,gsm8k-hard,0",
        "10,a,gsm8k,1",
        "10,a-hard,gsm8k-hard,1",
    ]


def test_metrics_alone_print_the_step_table_without_a_store(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["runs", "table", str(_metrics(tmp_path / "metrics.jsonl"))]) == 0
    printed = capsys.readouterr().out
    assert "| 2 | 10.00 | generation 4.0 s (40%) | 4.00 |" in printed and "| step | rollouts |" not in printed
    assert "GPU idle" not in printed.split("\n\n")[-1] and "validation per problem" not in printed


@pytest.mark.parametrize(
    "args, why",
    [
        (["--versus", "other.db"], "--versus compares this run's store (--calls) with another's: give --calls too"),
        (["--outcomes", "v.csv"], "--outcomes reads the run's store (--calls): give --calls too"),
        (["--calls", "absent.db"], "absent.db: no such store file"),
    ],
)
def test_what_needs_the_runs_store_is_refused_without_it(
    tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], why: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["runs", "table", str(_metrics(tmp_path / "metrics.jsonl")), *args])
    assert exit_.value.code == 2
    assert f"calcx runs table: error: {why}" in capsys.readouterr().err
    assert not (tmp_path / "v.csv").exists()


def test_the_tables_need_no_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Imported afresh with matplotlib unimportable: the tables, with a store, still print."""
    for name in [
        m for m in sys.modules if m.split(".")[0] == "matplotlib" or m.startswith(("calcx.runs", "calcx.trainer"))
    ]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    mine = _with_training(val_store(tmp_path / "mine.db", {0: {"a": "right"}}))
    assert main(["runs", "table", str(_metrics(tmp_path / "metrics.jsonl")), "--calls", str(mine)]) == 0
    assert "validation per problem" in capsys.readouterr().out
