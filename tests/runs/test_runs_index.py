"""Run records: a run.yaml that says what ran, its headline read from its metrics, and
results/INDEX.md made from them (and checked against them)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from calcx.cli import main
from calcx.runs.record import RecordError, read_record

RECORD = {
    "name": "calculator-recipe",
    "date": "2026-12-03",
    "commit": "5077c31aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "artifact": {"name": "calcx-gpu.pex", "bytes": 750626545, "sha256": "f4f3069b1cef" + "0" * 52},
    "command": "calcx-gpu.pex train --profile gsm8k-h200-calculator",
    "profile": "gsm8k-h200-calculator",
    "mode": "sync",
    "steps": 20,
    "model": "Qwen2.5-Coder-1.5B-Instruct",
    "machine": {"gpu": "NVIDIA H200, 143771 MiB"},
    "train_sets": [{"file": "train.parquet", "rows": 6473, "source": "gsm8k"}],
    "validation_sets": [
        {"file": "test.parquet", "rows": 1000, "source": "gsm8k"},
        {"file": "test-hard.parquet", "rows": 434, "source": "gsm8k-hard"},
    ],
}


def _run(root: Path, record: dict, metrics: list[dict] | None = None) -> Path:
    folder = root / f"{record['date']}-{record['name']}"
    folder.mkdir(parents=True)
    (folder / "run.yaml").write_text(yaml.safe_dump(record))
    if metrics is not None:
        (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return folder


def test_the_headline_is_the_last_validation_by_source_with_its_standard_error(tmp_path: Path) -> None:
    folder = _run(
        tmp_path,
        RECORD,
        [
            {"step": 0, "data": {"val-core/gsm8k/reward/mean@1": 0.26}},
            {
                "step": 20,
                "data": {
                    "val-core/gsm8k/reward/mean@1": 0.716,
                    "val-core/gsm8k-hard/reward/mean@1": 0.606,
                    "timing_s/step": 10.0,
                },
            },
        ],
    )
    last = read_record(folder).last_validation()
    assert last is not None
    step, accuracies = last
    assert step == 20 and [(a.source, a.accuracy, a.n) for a in accuracies] == [
        ("gsm8k", 0.716, 1000),
        ("gsm8k-hard", 0.606, 434),
    ]
    assert accuracies[0].standard_error == pytest.approx(math.sqrt(0.716 * 0.284 / 1000))


def test_index_is_made_from_the_records_and_checked_against_them(tmp_path: Path, capsys) -> None:
    root, out = tmp_path / "runs", tmp_path / "INDEX.md"
    _run(root, RECORD, [{"step": 20, "data": {"val-core/gsm8k/reward/mean@1": 0.5}}])
    _run(root, {**RECORD, "name": "default-sync", "profile": "gsm8k-h200"})  # no metrics yet: no headline
    args = ["runs", "index", "--root", str(root), "--out", str(out)]
    assert main([*args, "--check"]) == 1 and "is not what the records make" in capsys.readouterr().err
    assert main(args) == 0 and "(2 runs)" in capsys.readouterr().out
    lines = out.read_text().splitlines()
    assert lines[-2] == (
        "| [2026-12-03-calculator-recipe](runs/2026-12-03-calculator-recipe/) | gsm8k-h200-calculator "
        "| sync | 20 | gsm8k 1000, gsm8k-hard 434 | step 20: gsm8k 0.500 (0.016) | `f4f3069b1cef` "
        "| `5077c31aa` |"
    )
    assert lines[-1].startswith("| [2026-12-03-default-sync](runs/2026-12-03-default-sync/) | gsm8k-h200 |")
    assert lines[-1].endswith("| - | `f4f3069b1cef` | `5077c31aa` |")
    assert main([*args, "--check"]) == 0


def test_an_incomplete_record_names_what_it_lacks(tmp_path: Path, capsys) -> None:
    folder = _run(tmp_path, {k: v for k, v in RECORD.items() if k not in ("commit", "validation_sets")})
    with pytest.raises(RecordError, match=r"run.yaml: missing commit, validation_sets"):
        read_record(folder)
    moved = _run(tmp_path / "b", {**RECORD, "name": "other"})
    moved.rename(tmp_path / "b" / "2026-12-03-elsewhere")
    with pytest.raises(RecordError, match=r"lives in a folder 2026-12-03-other/"):
        read_record(tmp_path / "b" / "2026-12-03-elsewhere")
    bad_sets = _run(tmp_path / "c", {**RECORD, "validation_sets": [{"file": "t.parquet", "rows": "many"}]})
    with pytest.raises(RecordError, match=r"each of 'validation_sets' needs file, rows"):
        read_record(bad_sets)
    assert main(["runs", "index", "--root", str(tmp_path), "--out", str(tmp_path / "I.md")]) == 2
    assert "calcx runs: error:" in capsys.readouterr().err


def test_the_committed_index_is_what_the_committed_records_make() -> None:
    assert main(["runs", "index", "--check"]) == 0


def test_a_fact_not_known_is_written_unknown_and_a_warm_up_validates_on_nothing(tmp_path: Path) -> None:
    root, out = tmp_path / "runs", tmp_path / "INDEX.md"
    _run(
        root,
        {
            **RECORD,
            "name": "early",
            "commit": "unknown",
            "artifact": {"name": "wheels", "sha256": "unknown"},
            "validation_sets": [{"file": "unknown", "rows": "unknown", "source": "gsm8k"}],
        },
        [{"step": 10, "data": {"val-core/gsm8k/reward/mean@1": 0.5}}],
    )
    _run(root, {**RECORD, "name": "warmup", "mode": "warmup", "validation_sets": []})
    early = read_record(root / "2026-12-03-early")
    assert early.validation_sets[0].rows is None
    last = early.last_validation()
    assert last is not None and last[1][0].n == 0 and math.isnan(last[1][0].standard_error)
    assert read_record(root / "2026-12-03-warmup").validation_sets == []
    assert main(["runs", "index", "--root", str(root), "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[-2] == (
        "| [2026-12-03-early](runs/2026-12-03-early/) | gsm8k-h200-calculator | sync | 20 | gsm8k unknown "
        "| step 10: gsm8k 0.500 (SE unknown) | `unknown` | `unknown` |"
    )
    assert "| warmup | 20 | none | - |" in lines[-1]
    with pytest.raises(RecordError, match=r"'train_sets' must be a list"):
        read_record(_run(tmp_path / "d", {**RECORD, "train_sets": []}))
