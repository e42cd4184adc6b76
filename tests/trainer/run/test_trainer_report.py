"""Run report: reward curve PNG from a metrics JSONL, accuracy table by source, replica URLs."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from calcx.trainer.run.report import ReportError, eval_rows, eval_table_markdown, read_metrics, write_report
from calcx.trainer.workers.replicas import openai_endpoints


def _metrics(path: Path) -> Path:
    lines = [{"step": s, "data": {"critic/score/mean": 0.1 * s, "actor/lr": 1e-6}} for s in (1, 2, 3)]
    lines.append({"step": 3, "data": {"val-core/ape210k/reward/mean@1": 0.4}})
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_report_writes_a_png_and_the_right_table(tmp_path: Path) -> None:
    records = (
        [{"source": "ape210k", "reward": 1.0}] * 3
        + [{"source": "ape210k", "reward": 0.0}]
        + [{"source": "gsm8k", "reward": 0.0}, {"source": "gsm8k", "reward": 1.0}]
    )
    report = write_report(
        tmp_path / "out", metrics_path=_metrics(tmp_path / "m.jsonl"), eval_records=records, incomplete_groups=2
    )
    png = tmp_path / "out" / "reward_curve.png"
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (700, 400) and len(data) > 5000
    text = report.read_text()
    assert "| ape210k | 4 | 3 | 75.0% |" in text
    assert "| gsm8k | 2 | 1 | 50.0% |" in text
    assert "| **all** | 6 | 4 | 66.7% |" in text
    assert "first 0.100, last 0.300" in text and "incomplete: 2" in text


def test_flat_metrics_lines_are_read_too(tmp_path: Path) -> None:
    p = tmp_path / "flat.jsonl"
    p.write_text('{"step": 2, "reward/mean": 0.5}\n\n{"step": 1, "reward/mean": 0.25}\n')
    assert [m["reward/mean"] for m in read_metrics(p)] == [0.5, 0.25]
    write_report(tmp_path, metrics_path=p, eval_records=None)
    assert "first 0.250, last 0.500" in (tmp_path / "report.md").read_text()


def test_bad_inputs_name_what_is_wrong(tmp_path: Path) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text('{"step": 1, "reward/mean": 0.5}\nnot json\n')
    with pytest.raises(ReportError, match="bad.jsonl:2"):
        read_metrics(p)
    p.write_text('{"step": 1, "actor/lr": 0.5}\n')
    with pytest.raises(ReportError, match="reward curve"):
        write_report(tmp_path / "o", metrics_path=p, eval_records=None)
    with pytest.raises(ReportError, match="no finite reward"):
        eval_rows([{"source": "x", "reward": None}])


def test_table_with_no_rows_is_still_well_formed() -> None:
    assert eval_table_markdown(eval_rows([])).splitlines()[-1] == "| **all** | 0 | 0 | 0.0% |"


def test_replica_addresses_become_openai_base_urls() -> None:
    assert openai_endpoints(["10.0.0.5:8001", "[fd00::1]:8002", "10.0.0.5:8001", "http://h:1/v1/"]) == [
        "http://10.0.0.5:8001/v1",
        "http://[fd00::1]:8002/v1",
        "http://h:1/v1",
    ]
    with pytest.raises(ValueError, match="no vLLM replica"):
        openai_endpoints(["", " "])


def _legends_drawn(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The legend labels of each reward figure the report draws from now on, in order."""
    from calcx.trainer.run import report as report_module

    drawn: list[list[str]] = []
    save = report_module._save_reward_axes

    def spy(fig, ax, title, out, **kwargs):  # type: ignore[no-untyped-def]
        drawn.append([line.get_label() for line in ax.get_lines()])
        return save(fig, ax, title, out, **kwargs)

    monkeypatch.setattr(report_module, "_save_reward_axes", spy)
    return drawn


def test_report_draws_and_states_calculator_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`calcx/{train,val}/tool_use` go on the reward figure (as lines beside the reward) and into
    report.md; a run without them keeps the old figure and text."""
    from calcx.trainer.run import report as report_module

    lines = [{"step": s, "data": {"critic/score/mean": 0.1 * s, "calcx/train/tool_use": 0.5 / s}} for s in (1, 2)]
    lines.append(
        {
            "step": 2,
            "data": {
                "calcx/val/tool_use": 0.25,
                "calcx/val/tool_parse_failures": 4.0,
                "val-core/gsm8k/reward/mean@1": 0.5,
            },
        }
    )
    metrics = tmp_path / "m.jsonl"
    metrics.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    drawn = _legends_drawn(monkeypatch)
    TRAINING_REWARD = "training reward (mean of a step's rollouts)"  # verl's critic/score/mean, in words
    text = write_report(tmp_path / "out", metrics_path=metrics, eval_records=None).read_text()
    assert drawn[-1] == [TRAINING_REWARD, "validation", "train tool use", "validation tool use"]
    assert (
        "train tool use (share of rollouts with a successful calculator call): first 50.0% (step 1), "
        "last 25.0% (step 2)" in text
    )
    assert "validation tool use (share of rollouts with a successful calculator call): first 25.0% (step 2)" in text
    assert "tool-call parse failures at the last validation (step 2): 4" in text

    text = write_report(tmp_path / "old", metrics_path=_metrics(tmp_path / "old.jsonl"), eval_records=None).read_text()
    assert drawn[-1] == [TRAINING_REWARD, "validation"] and "tool use" not in text

    # several validation sources: one line each, each source's own points
    both = tmp_path / "both.jsonl"
    both.write_text(
        "".join(
            json.dumps(
                {
                    "step": s,
                    "data": {
                        "critic/score/mean": 0.5,
                        "val-core/gsm8k/reward/mean@1": g,
                        "val-core/gsm8k-hard/reward/mean@1": h,
                    },
                }
            )
            + "\n"
            for s, g, h in ((1, 0.6, 0.4), (2, 0.7, 0.5))
        )
    )
    write_report(tmp_path / "both", metrics_path=both, eval_records=None)
    assert drawn[-1] == [TRAINING_REWARD, "validation (gsm8k)", "validation (gsm8k-hard)"]
    assert report_module.validation_points_by_source(read_metrics(both)) == {
        "gsm8k": [(1, 0.6), (2, 0.7)],
        "gsm8k-hard": [(1, 0.4), (2, 0.5)],
    }


def test_the_legend_names_the_training_reward_in_words(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The picture's legend says what the line is, not verl's metrics key it was read from."""
    from calcx.trainer.run import report as report_module

    drawn = _legends_drawn(monkeypatch)
    for key in ("critic/score/mean", "critic/rewards/mean", "reward/mean"):
        metrics = [{"step": 1, key: 0.25}, {"step": 2, key: 0.5}]
        report_module.plot_reward_curve(metrics, tmp_path / "curve.png")
        assert drawn[-1][0].startswith("training reward") and "(mean of a step's rollouts)" in drawn[-1][0]
        assert "/" not in drawn[-1][0]
    assert drawn[1] == ["training reward after verl's KL penalty (mean of a step's rollouts)"]
