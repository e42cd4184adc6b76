"""End-of-run report: a reward curve (PNG) from a metrics JSONL and an eval table by `source`.

Shared by the trainer and the CPU rehearsal. Metrics lines may be verl's file-logger form
(`{"step": s, "data": {...}}`) or flat (`{"step": s, "reward/mean": ...}`).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calcx.contract.labels import CORRECT_ABOVE, finite_reward
from calcx.trainer.run_dir.names import CURVE_FILE, EVAL_FILE, REPORT_FILE

# The training reward's metrics key, first found wins (verl's mean sequence score, then the rehearsal's
# name), and what the picture's legend calls it
REWARD_LABELS = {
    "critic/score/mean": "training reward (mean of a step's rollouts)",
    "critic/rewards/mean": "training reward after verl's KL penalty (mean of a step's rollouts)",
    "reward/mean": "training reward (mean of a step's rollouts)",
}
REWARD_KEYS = tuple(REWARD_LABELS)
VAL_KEY_PREFIX = "val-core/"
# the share of rollouts with >= 1 successful calculator call (calcx.trainer.rollouts.tool_use), drawn beside
# the reward: (metrics key, legend label)
TOOL_USE_SERIES = (("calcx/train/tool_use", "train tool use"), ("calcx/val/tool_use", "validation tool use"))


class ReportError(ValueError):
    """The metrics or eval input cannot make a report."""


def metric_series(metrics: Sequence[Mapping[str, Any]], key: str) -> list[tuple[int, float]]:
    """(step, value) of every finite number logged under `key`, by step."""
    return sorted(
        (int(m["step"]), float(m[key]))
        for m in metrics
        if isinstance(m.get(key), int | float) and not isinstance(m.get(key), bool) and math.isfinite(float(m[key]))
    )


def _plot_tool_use(ax, metrics: Sequence[Mapping[str, Any]]) -> bool:  # type: ignore[no-untyped-def]
    """Tool-use shares on the reward axes (both are in [0, 1]); whether any was drawn."""
    drawn = False
    for key, label in TOOL_USE_SERIES:
        points = metric_series(metrics, key)
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], "^:", markersize=4, label=label)
            drawn = True
    return drawn


def _save_reward_axes(fig, ax, title: str, out: Path, *, tool_use: bool = False) -> Path:  # type: ignore[no-untyped-def]
    """Label, title and write a reward figure as PNG; close it."""
    import matplotlib.pyplot as plt  # pants: no-infer-dep

    ax.set_xlabel("training step")
    ax.set_ylabel("mean reward / share of rollouts" if tool_use else "mean reward")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(out, format="png")
    plt.close(fig)
    return out


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Flattened metric lines, each with an int `step`. Bad lines are an error naming the line."""
    rows = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise ReportError(f"{path}:{number}: not JSON ({exc})") from exc
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise ReportError(f"{path}:{number}: a metrics line needs an integer 'step'")
        flat = dict(record.get("data") or {}) if isinstance(record.get("data"), dict) else dict(record)
        flat["step"] = record["step"]
        rows.append(flat)
    return rows


def reward_series(metrics: Sequence[Mapping[str, Any]], key: str | None = None) -> tuple[str, list[int], list[float]]:
    """(key used, steps, values) for the reward curve; the key is the first of REWARD_KEYS present."""
    keys = [key] if key else list(REWARD_KEYS)
    for candidate in keys:
        points = [
            (int(m["step"]), float(m[candidate]))
            for m in metrics
            if isinstance(m.get(candidate), int | float) and math.isfinite(float(m[candidate]))
        ]
        if points:
            points.sort()
            return candidate, [p[0] for p in points], [p[1] for p in points]
    raise ReportError(f"no metrics line has any of {keys}; cannot draw a reward curve")


def plot_reward_curve(
    metrics: Sequence[Mapping[str, Any]],
    out_png: str | Path,
    *,
    key: str | None = None,
    title: str = "Calc-X training reward",
) -> Path:
    import matplotlib  # pants: no-infer-dep (the trainer takes its whole resolve; `calcx runs` draws only through curves.py)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pants: no-infer-dep

    used, steps, values = reward_series(metrics, key)
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    label = REWARD_LABELS.get(used, f"training reward ({used})")  # `key`: any metric the caller names
    ax.plot(steps, values, marker="o", markersize=3, linewidth=1.5, label=label)
    _plot_validation_by_source(ax, metrics)
    return _save_reward_axes(fig, ax, title, out, tool_use=_plot_tool_use(ax, metrics))


def validation_points_by_source(metrics: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """Each validation source's (step, accuracy) points, in step order."""
    points: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for m in metrics:
        for source, value in validation_by_source(m).items():
            points[source].append((int(m["step"]), value))
    return {source: sorted(found) for source, found in sorted(points.items())}


def _plot_validation_by_source(ax: Any, metrics: Sequence[Mapping[str, Any]]) -> None:
    """One dashed line a validation source (`validation (gsm8k)`, ...; plain `validation` for one)."""
    by_source = validation_points_by_source(metrics)
    for source, points in by_source.items():
        label = "validation" if len(by_source) == 1 else f"validation ({source})"
        ax.plot([p[0] for p in points], [p[1] for p in points], "s--", markersize=4, label=label)


@dataclass
class EvalRow:
    source: str
    n: int
    correct: int

    @property
    def accuracy(self) -> float:
        return self.correct / self.n if self.n else 0.0


def eval_rows(records: Iterable[Mapping[str, Any]], *, threshold: float = CORRECT_ABOVE) -> list[EvalRow]:
    """Accuracy by `source`; a record is `{"source": str, "reward": float}`, correct when reward > threshold.
    A record without a finite reward is an error: an unscored answer is not a wrong one."""
    by_source: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for number, record in enumerate(records, start=1):
        reward = finite_reward(record.get("reward"))
        if reward is None:
            raise ReportError(
                f"eval record {number} ({record.get('source')!r}) has no finite reward: " f"{record.get('reward')!r}"
            )
        cell = by_source[str(record.get("source") or "unknown")]
        cell[0] += 1
        cell[1] += int(reward > threshold)
    return [EvalRow(source, n, correct) for source, (n, correct) in sorted(by_source.items())]


def eval_table_markdown(rows: Sequence[EvalRow]) -> str:
    total_n = sum(r.n for r in rows)
    total_correct = sum(r.correct for r in rows)
    lines = ["| source | n | correct | accuracy |", "|---|---:|---:|---:|"]
    lines += [f"| {r.source} | {r.n} | {r.correct} | {r.accuracy:.1%} |" for r in rows]
    overall = total_correct / total_n if total_n else 0.0
    lines.append(f"| **all** | {total_n} | {total_correct} | {overall:.1%} |")
    return "\n".join(lines) + "\n"


def plot_placeholder(out_png: str | Path, note: str, *, title: str = "Calc-X training reward") -> Path:
    """A reward-curve PNG that says why there is no curve (a run that trained no step)."""
    import matplotlib  # pants: no-infer-dep (the trainer takes its whole resolve; `calcx runs` draws only through curves.py)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pants: no-infer-dep

    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.text(0.5, 0.5, note, ha="center", va="center", wrap=True, transform=ax.transAxes)
    ax.set_xlabel("training step")
    ax.set_ylabel("mean reward")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out, format="png")
    plt.close(fig)
    return out


def write_eval_markdown(
    out_dir: str | Path,
    records: Sequence[Mapping[str, Any]],
    *,
    title: str = "Calc-X evaluation",
    note: str | None = None,
) -> Path:
    """`eval.md`: accuracy by source (plus a note, e.g. which step and how many rollouts failed)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    parts = [f"# {title}", ""] + ([note, ""] if note else []) + [eval_table_markdown(eval_rows(records))]
    path = out / EVAL_FILE
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def write_report(
    out_dir: str | Path,
    *,
    metrics_path: str | Path | None,
    eval_records: Iterable[Mapping[str, Any]] | None,
    title: str = "Calc-X run report",
    incomplete_groups: int | None = None,
    allow_no_reward: bool = False,
    eval_note: str | None = None,
) -> Path:
    """Write `reward_curve.png` (when metrics exist), `eval.md` (when eval records are given) and
    `report.md`; return the report's path.

    With `allow_no_reward` (the trainer's end-of-run report) a run without any reward line still
    gets a `reward_curve.png`: its validation points if it has some, else a figure saying why not.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    parts = [f"# {title}", ""]
    metrics = read_metrics(metrics_path) if metrics_path is not None and Path(metrics_path).exists() else None
    if metrics_path is not None and metrics is None and not allow_no_reward:
        raise ReportError(f"{metrics_path} does not exist; cannot draw a reward curve")
    used = ""
    steps: list[int] = []
    values: list[float] = []
    if metrics is not None or allow_no_reward:
        try:
            used, steps, values = reward_series(metrics or [])
        except ReportError:
            if not allow_no_reward:
                raise
    if steps:
        plot_reward_curve(metrics or [], out / CURVE_FILE)
        parts += [
            f"Reward ({used}) over {len(steps)} step(s): first {values[0]:.3f}, last {values[-1]:.3f}, "
            f"best {max(values):.3f}.",
            "",
            "![reward curve](reward_curve.png)",
            "",
        ]
    elif allow_no_reward:
        val = validation_series(metrics or [])
        if val:
            plot_validation_curve(val, out / CURVE_FILE, metrics=metrics or [])
            parts += [
                f"No training step recorded a reward; validation reward over {len(val)} point(s).",
                "",
                "![reward curve](reward_curve.png)",
                "",
            ]
        else:
            plot_placeholder(out / CURVE_FILE, "no training step recorded a reward")
            parts += ["No training step recorded a reward (see the run's logs).", ""]
    parts += tool_use_lines(metrics or [])
    if incomplete_groups is not None:
        parts += [f"GRPO groups left out as incomplete: {incomplete_groups}.", ""]
    if eval_records is not None:
        records = list(eval_records)
        write_eval_markdown(out, records, note=eval_note)
        parts += ["## Evaluation (accuracy by source)", ""] + ([eval_note, ""] if eval_note else [])
        parts += [eval_table_markdown(eval_rows(records))]
    path = out / REPORT_FILE
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def tool_use_lines(metrics: Sequence[Mapping[str, Any]]) -> list[str]:
    """report.md's tool-use sentence: first and last share of rollouts with a successful calculator
    call, and the last validation's parse failures ([] when the run logged no tool use)."""
    parts = []
    for key, label in TOOL_USE_SERIES:
        points = metric_series(metrics, key)
        if points:
            parts.append(
                f"{label} (share of rollouts with a successful calculator call): first {points[0][1]:.1%} "
                f"(step {points[0][0]}), last {points[-1][1]:.1%} (step {points[-1][0]})"
            )
    failures = metric_series(metrics, "calcx/val/tool_parse_failures")
    if failures:
        parts.append(
            f"tool-call parse failures at the last validation (step {failures[-1][0]}): " f"{failures[-1][1]:.0f}"
        )
    return ["; ".join(parts) + ".", ""] if parts else []


def _validation_value(key: str, value: Any) -> bool:
    """Whether a metrics entry is a validation accuracy verl logged (`val-core/<source>/.../mean@1`)."""
    return (
        key.startswith(VAL_KEY_PREFIX)
        and key.endswith("/mean@1")
        and isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def validation_by_source(metrics: Mapping[str, Any]) -> dict[str, float]:
    """One metrics line's validation accuracy by data source (`val-core/<source>/.../mean@1`)."""
    found: dict[str, float] = {}
    for k, v in metrics.items():
        if _validation_value(k, v):
            found.setdefault(k[len(VAL_KEY_PREFIX) :].split("/", 1)[0], float(v))
    return dict(sorted(found.items()))


def validation_series(metrics: Sequence[Mapping[str, Any]]) -> list[tuple[int, float]]:
    """(step, mean of the `val-core/*/mean@1` values) per step that has any."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for m in metrics:
        for k, v in m.items():
            if _validation_value(k, v):
                by_step[int(m["step"])].append(float(v))
    return sorted((step, sum(vs) / len(vs)) for step, vs in by_step.items())


def plot_validation_curve(
    points: Sequence[tuple[int, float]],
    out_png: str | Path,
    title: str = "Calc-X validation reward",
    metrics: Sequence[Mapping[str, Any]] | None = None,
) -> Path:
    import matplotlib  # pants: no-infer-dep (the trainer takes its whole resolve; `calcx runs` draws only through curves.py)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pants: no-infer-dep

    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot([p[0] for p in points], [p[1] for p in points], "s--", markersize=5, label="validation")
    return _save_reward_axes(fig, ax, title, out, tool_use=_plot_tool_use(ax, metrics or []))


def count_incomplete(path: str | Path) -> int:
    """Distinct (uid, step) groups in an `incomplete_groups.jsonl` (0 when the file is absent)."""
    p = Path(path)
    if not p.exists():
        return 0
    groups = set()
    for line in p.read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            groups.add((record.get("uid"), record.get("step")))
    return len(groups)
