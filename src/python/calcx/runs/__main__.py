"""`calcx runs`: the committed GPU runs' records and the figures of one run.

calcx runs index [--check]                      results/INDEX.md from results/runs/*/run.yaml
calcx runs table METRICS.jsonl [--calls DB ...]  a run's step tables (its steps.md)
calcx runs curves --out PNG LABEL=METRICS.jsonl...  runs side by side in one picture
calcx runs startup [LABEL=]TRAIN_LOG...              each run's start-up phases, in seconds
calcx runs traces STORE... --out F --exclude FILE...  a run's right calculator answers as warm-up traces
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from calcx.contract.env import AGENT_PROMPTS
from calcx.runs import startup, table
from calcx.runs.index import records, render_index
from calcx.runs.record import RecordError
from calcx.runs.traces import PER_PROBLEM_DEFAULT


def _index(args: argparse.Namespace) -> int:
    try:
        text = render_index(args.root, link_base=os.path.relpath(args.root, args.out.parent))
    except RecordError as exc:
        print(f"calcx runs: error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.is_file() else ""
        if current != text:
            print(f"calcx runs: {args.out} is not what the records make; run `calcx runs index`", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out} ({len(records(args.root))} runs)")
    return 0


CURVES_DESCRIPTION = (
    "One picture of GPU runs side by side: training reward, validation accuracy by source and, "
    "when the runs logged it, calculator use, one colour a run (calcx.runs.curves)."
)
CURVES_TITLE = "calcx GRPO on GSM8K, Qwen2.5-Coder-1.5B-Instruct, one H200"


def _curves(args: argparse.Namespace) -> int:
    try:
        from calcx.runs import curves  # pants: no-infer-dep (not in the `calcx` PEX: BUILD says why)
    except ImportError as exc:
        raise SystemExit(
            f"calcx runs curves: this build lacks what pictures need ({exc}); "
            "run it from calcx-gpu.pex or a checkout (docs/gpu-run.md)"
        ) from exc
    print(curves.draw(curves.parse_runs(args.parser, args.runs), args.out, args.title))
    return 0


TRACES_DESCRIPTION = (
    "Warm-up traces from runs' stores (calcx.runs.traces): each rollout that earned a right answer with "
    "the calculator, no call refused or unparsed, its last call an answer, as the conversation the agent "
    "had and the tools it was offered, the layout `calcx data traces` writes and `calcx warmup` reads. "
    "The rollouts left out are counted by reason."
)


def _traces(args: argparse.Namespace) -> int:
    from calcx.data.held_out import HeldOut
    from calcx.data.schema import DataError
    from calcx.data.traces import TRACE_SUFFIXES, write_traces
    from calcx.runs import traces

    out: Path = args.out
    if out.suffix not in TRACE_SUFFIXES:
        args.parser.error(f"--out {out} must end in {' or '.join(TRACE_SUFFIXES)}")
    if out.exists() and not args.force:
        args.parser.error(f"{out} already exists; pass --force to overwrite")
    if args.per_problem < 1:
        args.parser.error(f"--per-problem must be at least 1, got {args.per_problem}")
    missing = [str(store) for store in args.stores if not store.is_file()]
    if missing:
        args.parser.error(f"no store file {', '.join(missing)}")
    try:
        held_out = HeldOut.read(args.exclude)
    except (DataError, OSError) as exc:
        args.parser.error(f"--exclude: {exc}")
    result = traces.store_traces(
        args.stores, held_out, per_problem=args.per_problem, system_message=args.system_message
    )
    left_out = sum(result.left_out.values())
    print(
        f"calcx runs traces: {result.rollouts} rollouts read, {len(result.traces)} kept, {left_out} left out"
        + (f" ({traces.left_out_line(result.left_out)})" if left_out else ""),
        file=sys.stderr,
    )
    if not result.traces:
        print("calcx runs traces: error: no rollout made a trace; nothing written", file=sys.stderr)
        return 1
    write_traces(result.traces, out)
    print(f"wrote {out} ({len(result.traces)} traces of {result.problems} problems, {result.calls} calculator calls)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="calcx runs", description="Committed GPU runs as records, and a run's figures."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    index = sub.add_parser("index", help="results/INDEX.md from results/runs/*/run.yaml")
    index.add_argument(
        "--root", type=Path, default=Path("results/runs"), help="the runs' folder (default results/runs)"
    )
    index.add_argument(
        "--out", type=Path, default=Path("results/INDEX.md"), help="the index (default results/INDEX.md)"
    )
    index.add_argument("--check", action="store_true", help="exit 1 when the index is not what the records make")
    tables = sub.add_parser(
        "table", help="a run's step tables from its metrics (and its store)", description=table.DESCRIPTION
    )
    table.add_arguments(tables)
    pictures = sub.add_parser(
        "curves", help="runs' reward, validation and calculator use in one PNG", description=CURVES_DESCRIPTION
    )
    pictures.add_argument("runs", nargs="+", metavar="LABEL=METRICS.jsonl")
    pictures.add_argument("--out", type=Path, required=True)
    pictures.add_argument("--title", default=CURVES_TITLE)
    starts = sub.add_parser(
        "startup", help="runs' start-up phases (seconds) from their train.log", description=startup.__doc__
    )
    starts.add_argument("logs", nargs="+", metavar="[LABEL=]TRAIN_LOG")
    distil = sub.add_parser(
        "traces", help="a run's right calculator answers as warm-up traces", description=TRACES_DESCRIPTION
    )
    distil.add_argument("stores", nargs="+", type=Path, metavar="STORE", help="a run's store (services/calcx.db)")
    distil.add_argument("--out", type=Path, required=True, help="traces file: .parquet (calcx warmup) or .jsonl")
    distil.add_argument(
        "--exclude",
        nargs="+",
        required=True,
        metavar="FILE",
        help="the held-out rows (the validation files): a rollout of a problem whose id or question is in "
        "them makes no trace. Required: a store of a training run holds its validation rollouts too",
    )
    distil.add_argument(
        "--per-problem",
        type=int,
        default=PER_PROBLEM_DEFAULT,
        metavar="K",
        help=f"at most K distinct traces a problem, the first in the store (default {PER_PROBLEM_DEFAULT})",
    )
    distil.add_argument(
        "--system-message",
        choices=AGENT_PROMPTS,
        default=None,
        help="replace the recorded system message by this one of the agent's (the one RL runs with; "
        "default: keep the recorded one)",
    )
    distil.add_argument("--force", action="store_true", help="overwrite an existing file")
    for command in (index, tables, pictures, starts, distil):
        command.set_defaults(parser=command)  # a refusal names the subcommand and shows its usage
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "table":
        table.check_arguments(args.parser, args)
        return table.print_tables(args)
    if args.command == "curves":
        return _curves(args)
    if args.command == "traces":
        return _traces(args)
    if args.command == "startup":
        logs = dict(spec.split("=", 1) if "=" in spec else (Path(spec).parent.name or spec, spec) for spec in args.logs)
        print(startup.startup_table({label: Path(path) for label, path in logs.items()}))
        return 0
    return _index(args)


if __name__ == "__main__":
    sys.exit(main())
