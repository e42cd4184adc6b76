"""`src/gpu/curves.py` draws runs side by side, with a calculator-use panel when a run logged
`calcx/{train,val}/tool_use` (the figure docs/recipes.md and the run records compare recipes with)."""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path

CURVES = Path("src/gpu/curves.py")


def _curves():
    spec = importlib.util.spec_from_file_location("curves", CURVES)
    assert spec is not None and spec.loader is not None, f"{CURVES} is missing"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def test_a_third_panel_shows_calculator_use_when_a_run_logged_it(tmp_path: Path) -> None:
    curves = _curves()
    out = curves.draw([("today", _run(tmp_path / "a.jsonl", False)), ("recipe", _run(tmp_path / "b.jsonl", True))],
                      tmp_path / "both.png", "t")
    assert _size(out) == (1600, 400)
    out = curves.draw([("today", _run(tmp_path / "a.jsonl", False))], tmp_path / "old.png", "t")
    assert _size(out) == (1100, 400)
