"""`calcx runs curves`: one picture of GPU runs side by side: training reward per step (left),
validation accuracy (middle) and, when the runs logged it, calculator use (right: the share of
rollouts with a successful calculator call, `calcx/train/tool_use` solid, `calcx/val/tool_use`
dashed), one colour per run (and in the middle one line per validation source), from verl's metrics
files (the `file` logger's JSONL).

    calcx runs curves --out results/gpu-run/curves.png sync=results/gpu-run/sync_metrics.jsonl [async=...]

matplotlib is imported only when a picture is drawn, and `calcx runs` imports this module only for
`curves`: the tables need none of it (the `calcx` PEX leaves it out, src/python/calcx/runs/BUILD).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from calcx.trainer.run.report import (
    TOOL_USE_SERIES,
    metric_series,
    read_metrics,
    reward_series,
    validation_points_by_source,
)

Labelled = dict[int, list[tuple[float, str]]]  # step -> (accuracy, colour) of every run


def parse_runs(parser: argparse.ArgumentParser, items: list[str]) -> list[tuple[str, Path]]:
    """(label, metrics file) of each LABEL=PATH; exit 2 on one without `=` or without its file."""
    runs = []
    for item in items:
        label, sep, path = item.partition("=")
        if not sep or not Path(path).is_file():
            parser.error(f"{item!r}: give LABEL=PATH to an existing metrics file")
        runs.append((label, Path(path)))
    return runs


def _plot_run(axes: Any, label: str, metrics: list[dict], with_tool_use: bool, labelled: Labelled) -> None:
    """One run's lines, in one colour: its reward, its calculator use, its validation by source."""
    reward_ax, val_ax = axes[0], axes[1]
    _, steps, values = reward_series(metrics)
    (reward_line,) = reward_ax.plot(steps, values, "o-", markersize=3, label=label)
    if with_tool_use:
        for (key, _), style in zip(TOOL_USE_SERIES, ("o-", "s--")):
            points = metric_series(metrics, key)
            if points:
                axes[2].plot(
                    [p[0] for p in points],
                    [p[1] for p in points],
                    style,
                    markersize=3,
                    color=reward_line.get_color(),
                    label=f"{label} {key.split('/')[1]}",
                )
    by_source = validation_points_by_source(metrics)
    for (source, points), style in zip(by_source.items(), ("s--", "^:", "d-.", "v:")):
        # one line a validation source (gsm8k, gsm8k-hard, ...), in the run's colour
        (line,) = val_ax.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            style,
            markersize=5,
            color=reward_line.get_color(),
            label=label if len(by_source) == 1 else f"{label} ({source})",
        )
        for step, acc in points:
            labelled.setdefault(step, []).append((acc, line.get_color()))


def _annotate(val_ax: Any, labelled: Labelled) -> None:
    """At each step the highest value is labelled above its point, the lowest below and any between
    to the right, so that close values stay legible."""
    for step, marks in labelled.items():
        marks.sort()
        for rank, (acc, colour) in enumerate(marks):
            offset, align = (
                ((0, 7), "center")
                if rank == len(marks) - 1
                else (((0, -14), "center") if rank == 0 else ((8, -4), "left"))
            )
            val_ax.annotate(
                f"{acc:.3f}", (step, acc), textcoords="offset points", color=colour, xytext=offset, ha=align
            )


def draw(runs: list[tuple[str, Path]], out: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loaded = [(label, read_metrics(path)) for label, path in runs]
    with_tool_use = any(metric_series(metrics, key) for _, metrics in loaded for key, _ in TOOL_USE_SERIES)
    fig, axes = plt.subplots(1, 3 if with_tool_use else 2, figsize=(16 if with_tool_use else 11, 4), dpi=100)
    labelled: Labelled = {}
    for label, metrics in loaded:
        _plot_run(axes, label, metrics, with_tool_use, labelled)
    _annotate(axes[1], labelled)
    axes[0].set(title="training reward (mean of 32 x 4 rollouts)", xlabel="step", ylabel="reward", ylim=(0, 1))
    axes[1].set(title="validation accuracy (held-out problems)", xlabel="step", ylabel="accuracy", ylim=(0, 1))
    if with_tool_use:
        axes[2].set(title="calculator use (share of rollouts)", xlabel="step", ylabel="share", ylim=(0, 1))
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
