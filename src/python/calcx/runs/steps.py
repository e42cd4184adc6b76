"""The step tables of a verl run from its metrics file alone (verl's `file` logger JSONL): one row a
step of timings, throughput, memory, reward, validation and evictions; the trainer's own tool-use
figures; and the summaries (validation accuracy by step, the GPU's idle share and the step time
over the steps that paid no start-up)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from pathlib import Path

from calcx.trainer.run.progress import dominant_phase

Metrics = Mapping[int, Mapping]  # step -> that step's metrics

TOOL_USE_COLUMNS = (
    ("equal-reward groups", "calcx/train/equal_reward_groups", "{:.0%}"),
    ("entropy", "actor/entropy", "{:.3f}"),
    ("train tool use", "calcx/train/tool_use", "{:.0%}"),
    ("train steps computed", "calcx/train/steps_computed", "{:.0%}"),
    ("train calls / rollout", "calcx/train/tool_calls_per_rollout", "{:.2f}"),
    ("train parse failures", "calcx/train/tool_parse_failures", "{:.0f}"),
    ("val tool use", "calcx/val/tool_use", "{:.0%}"),
    ("val steps computed", "calcx/val/steps_computed", "{:.0%}"),
    ("val calls / rollout", "calcx/val/tool_calls_per_rollout", "{:.2f}"),
    ("val parse failures", "calcx/val/tool_parse_failures", "{:.0f}"),
)


def read_metrics(path: Path) -> dict[int, dict]:
    """Each step's metrics, the lines of one step merged (verl logs validation apart)."""
    steps: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            steps.setdefault(int(row["step"]), {}).update(row["data"])
    return steps


def tool_use_table(steps: Metrics) -> str:
    """The trainer's own `calcx/{train,val}/...` tool-use metrics per step ("" when the run logged
    none: an older run, or verl's own agent loop)."""
    rows = [(step, m) for step, m in sorted(steps.items()) if any(key in m for _, key, _ in TOOL_USE_COLUMNS)]
    if not rows:
        return ""
    lines = [
        "| step | " + " | ".join(name for name, _, _ in TOOL_USE_COLUMNS) + " |",
        "|" + "---:|" * (len(TOOL_USE_COLUMNS) + 1),
    ]
    for step, m in rows:
        cells = [fmt.format(m[key]) if key in m else "-" for _, key, fmt in TOOL_USE_COLUMNS]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _staleness(m: Mapping) -> str:
    """verl's largest trajectory staleness of the step's batch: the trained step minus one minus the
    newest policy version that served a trajectory (0: on-policy)."""
    value = m.get("training/off_policy/trajectory_staleness/max")
    return "-" if value is None else f"{value:.0f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def idle_share(m: Mapping, busy: float | None) -> float | None:
    """The share of the step the GPU waited for agents: the generation phase with no call inside
    vLLM (`busy`: the seconds with at least one call there), over the whole step."""
    gen, total = m.get("timing_s/gen"), m.get("timing_s/step")
    if busy is None or gen is None or not total:
        return None
    return max(0.0, gen - busy) / total


def steady_steps(steps: Metrics, restarts: set[int] | frozenset[int]) -> list[int]:
    """The steps that paid no start-up: all but the first and the first of each restart."""
    return [step for step in sorted(steps)[1:] if step not in restarts]


def idle_summary(
    steps: Metrics, busy: Mapping[int, float], restarts: set[int] | frozenset[int] = frozenset()
) -> str | None:
    """The mean and largest idle share over the steps after the first (the first pays start-up
    costs inside its generation phase), nor the first step of a restarted run (`restarts`, from
    the run's starts file), or None when no such step was measured."""
    shares = {step: idle_share(steps[step], busy.get(step)) for step in steady_steps(steps, restarts)}
    measured = {step: share for step, share in shares.items() if share is not None}
    if not measured:
        return None
    worst = max(measured, key=lambda step: measured[step])
    left_out = sorted(restarts & set(steps))
    besides = (
        f" and step{'s' if len(left_out) > 1 else ''} {', '.join(map(str, left_out))}, the first after a restart"
        if left_out
        else ""
    )
    return (
        f"GPU idle waiting for agents: mean {statistics.mean(measured.values()):.1%} of a step over "
        f"{len(measured)} step{'s' if len(measured) != 1 else ''} after the first{besides} (largest {measured[worst]:.1%}, step {worst})"
    )


def restarted_steps(starts: Path | None) -> set[int]:
    """The first steps of the restarts whose steps the metrics file still holds, from the run's
    starts.jsonl (calcx train writes a line each start). A start at step N sets aside the rows from
    N on, so it also ends every earlier start at N or later; the first start left is the run's."""
    if starts is None or not starts.is_file():
        return set()
    kept: list[int] = []
    for line in starts.read_text().splitlines():
        try:
            first = json.loads(line)["first_step"]
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by a crash while it was written says nothing
        kept = [step for step in kept if step < first] + [first]
    return set(kept[1:])


def _validation_values(m: Mapping) -> list[float]:
    """The step's validation accuracies (verl's `val-core/<source>/.../mean@1`), one a source."""
    return [v for k, v in m.items() if k.startswith("val-core/") and k.endswith("mean@1")]


def _dominant(m: Mapping) -> str:
    """`generation 6.2 s (46%)`: the step's longest phase and its share of the step."""
    phase, total = dominant_phase(m), m.get("timing_s/step")
    if phase is None or not total:
        return "-"
    return f"{phase[0]} {phase[1]:.1f} s ({phase[1] / total:.0%})"


def step_table(steps: Metrics, busy: Mapping[int, float] | None) -> str:
    """One row a step. Evicted samples are counted by why verl left them out: a group with a failed
    attempt (`rollout_failure`) or one older than the allowed staleness (`off_policy`, async)."""
    head = [
        "step",
        "step s",
        "dominant phase",
        "rollout (gen) s",
        "old log-prob s",
        "update s",
        "weight sync s",
        "tokens/s",
        "update MFU",
        "GPU mem peak GB",
        "GPU idle waiting for agents",
        "mean reward",
        "val accuracy",
        "trajectory staleness max",
        "evicted samples: failed",
        "evicted samples: stale",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for step in sorted(steps):
        m = steps[step]
        if "timing_s/step" not in m:
            continue
        idle = "n/a"
        if busy is not None:
            share = idle_share(m, busy.get(step))
            idle = "n/a" if share is None else f"{share:.0%}"
        val = _validation_values(m)
        cells = [
            str(step),
            f"{m['timing_s/step']:.2f}",
            _dominant(m),
            f"{m.get('timing_s/gen', float('nan')):.2f}",
            f"{m.get('timing_s/old_log_prob', float('nan')):.2f}",
            f"{m.get('timing_s/update_actor', float('nan')):.2f}",
            f"{m.get('timing_s/update_weights', float('nan')):.2f}",
            f"{m.get('perf/throughput', float('nan')):.0f}",
            _percent(m.get("perf/mfu/actor")),
            f"{m.get('actor/perf/max_memory_allocated_gb', float('nan')):.1f}",
            idle,
            f"{m.get('critic/score/mean', float('nan')):.3f}",
            f"{statistics.mean(val):.3f}" if val else "-",
            _staleness(m),
            f"{m.get('training/rollout_failure/evicted_samples', 0):.0f}",
            f"{m.get('training/off_policy/evicted_samples', 0):.0f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def validation_line(steps: Metrics) -> str | None:
    """`validation accuracy: step 0: 0.125, ...` (the mean over sources), or None without validation."""
    validation = [
        (step, statistics.mean(_validation_values(m))) for step, m in sorted(steps.items()) if _validation_values(m)
    ]
    if not validation:
        return None
    return "validation accuracy: " + ", ".join(f"step {step}: {acc:.3f}" for step, acc in validation)


def timed_steps(steps: Metrics) -> dict[int, Mapping]:
    """The steps verl timed (a validation-only line, step 0, has no step time)."""
    return {s: m for s, m in steps.items() if "timing_s/step" in m}


def step_time_line(timed: Metrics, restarts: set[int]) -> str | None:
    """The mean and median step time over the steps that paid no start-up, or None when none did."""
    after_first = [timed[s]["timing_s/step"] for s in steady_steps(timed, restarts)]
    if not after_first:
        return None
    besides = ", nor the first after a restart" if restarts & set(timed) else ""
    return (
        f"mean step time after the first{besides}: {statistics.mean(after_first):.2f} s "
        f"(median {statistics.median(after_first):.2f} s over {len(after_first)} steps)"
    )
