"""`calcx runs curves` draws runs side by side, with a calculator-use panel when a run logged
`calcx/{train,val}/tool_use` (the figure docs/recipes.md and the run records compare recipes with)."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

from calcx.cli import main
from calcx.runs import curves


def _run(path: Path, tool_use: bool) -> Path:
    lines = []
    for step in (1, 2):
        data = {"critic/score/mean": 0.2 * step, "val-core/gsm8k/reward/mean@1": 0.3 * step}
        if tool_use:
            data |= {"calcx/train/tool_use": 0.4 / step, "calcx/val/tool_use": 0.3 / step}
        lines.append({"step": step, "data": data})
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def _size(png: Path) -> tuple[int, int]:
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_a_third_panel_shows_calculator_use_when_a_run_logged_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from matplotlib.figure import Figure

    saved, panels = Figure.savefig, []

    def savefig(fig: Figure, *args: Any, **kwargs: Any) -> None:
        panels.append([ax.get_title() for ax in fig.axes])
        saved(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    out = curves.draw(
        [("today", _run(tmp_path / "a.jsonl", False)), ("recipe", _run(tmp_path / "b.jsonl", True))],
        tmp_path / "both.png",
        "t",
    )
    assert _size(out) == (1600, 400) and panels[-1][2] == "calculator use (share of rollouts)"
    out = curves.draw([("today", _run(tmp_path / "a.jsonl", False))], tmp_path / "old.png", "t")
    assert _size(out) == (1100, 400) and len(panels[-1]) == 2


def test_the_command_draws_labelled_runs_and_refuses_a_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "pictures" / "vs.png"
    assert main(["runs", "curves", "--out", str(out), f"default={_run(tmp_path / 'a.jsonl', True)}"]) == 0
    assert capsys.readouterr().out == f"{out}\n" and _size(out) == (1600, 400)
    for bad in (str(tmp_path / "a.jsonl"), f"x={tmp_path / 'absent.jsonl'}"):
        with pytest.raises(SystemExit) as exit_:
            main(["runs", "curves", "--out", str(tmp_path / "bad.png"), bad])
        assert exit_.value.code == 2
        assert (
            f"calcx runs curves: error: {bad!r}: give LABEL=PATH to an existing metrics file" in capsys.readouterr().err
        )
    assert not (tmp_path / "bad.png").exists()


def test_a_build_without_the_pictures_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The `calcx` PEX carries the tables, not the pictures (src/python/calcx/runs/BUILD)."""
    import calcx.runs

    monkeypatch.delattr(calcx.runs, "curves")
    monkeypatch.setitem(sys.modules, "calcx.runs.curves", None)  # not in this build
    with pytest.raises(SystemExit, match="calcx runs curves: this build lacks what pictures need"):
        main(["runs", "curves", "--out", str(tmp_path / "x.png"), f"a={_run(tmp_path / 'a.jsonl', False)}"])
