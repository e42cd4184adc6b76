"""results/INDEX.md: one line a committed run, made from the runs' records (never edited by hand)."""

from __future__ import annotations

from pathlib import Path

from calcx.runs.record import RECORD_FILE, UNKNOWN, Accuracy, RunRecord, read_record

HEADER = (
    "# GPU runs\n\nMade by `calcx runs index` from each run's run.yaml and metrics.jsonl; the "
    "accuracy is the last validation's, by source, with its standard error.\n"
)


def records(root: str | Path) -> list[RunRecord]:
    """Every run under `root` (folders holding a run.yaml), oldest first."""
    folders = sorted(p.parent for p in Path(root).glob(f"*/{RECORD_FILE}"))
    return [read_record(folder) for folder in folders]


def _accuracy(a: Accuracy) -> str:
    shown = f"({a.standard_error:.3f})" if a.n else "(SE unknown)"
    return f"{a.source} {a.accuracy:.3f} {shown}"


def render_index(root: str | Path, link_base: str = "runs") -> str:
    lines = [
        HEADER,
        "| run | profile | mode | steps | validation sets | last validation: accuracy (SE) | "
        "artifact sha256 | commit |",
        "|---|---|---|---:|---|---|---|---|",
    ]
    for record in records(root):
        data = record.data
        sets = (
            ", ".join(f"{s.source} {UNKNOWN if s.rows is None else s.rows}" for s in record.validation_sets) or "none"
        )
        last = record.last_validation()
        shown = "-" if last is None else f"step {last[0]}: " + ", ".join(_accuracy(a) for a in last[1])
        lines.append(
            f"| [{record.folder.name}]({link_base}/{record.folder.name}/) | {data['profile']} | "
            f"{data['mode']} | {data['steps']} | {sets} | {shown} | "
            f"`{str(data['artifact']['sha256'])[:12]}` | `{str(data['commit'])[:9]}` |"
        )
    return "\n".join(lines) + "\n"
