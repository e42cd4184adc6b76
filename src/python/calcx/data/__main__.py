"""``calcx data``: generate a Calc-X-style dataset, import GSM8K or Calc-X files, validate files,
turn GSM8K's calculator annotations into the agent's chat traces (a warm-up set), or make the
hard-arithmetic split of imported GSM8K rows."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from calcx.contract.env import TOOL_ROUNDS_DEFAULT, TOOL_ROUNDS_MAX, parse_tool_rounds
from calcx.data.hard_split import FACTOR_RANGE, HARD_SOURCE, id_suffix
from calcx.data.importers import FORMATS

SHOWN_PROBLEMS = 20
# a validation split of 1,000 rows measures an accuracy near 0.65 to a standard error of ~0.015
VAL_SIZE_DEFAULT = 1000


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="calcx data", description="Calc-X datasets: generate, import or validate.")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="write train/test/test_mini parquet files and sample.jsonl")
    gen.add_argument("--out", required=True, help="directory to write into (created if missing)")
    gen.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    gen.add_argument("--train-size", type=int, default=2000, help="rows in train.parquet (default 2000)")
    gen.add_argument("--test-size", type=int, default=200, help="rows in test.parquet (default 200)")
    gen.add_argument("--mini-size", type=int, default=50, help="rows in test_mini.parquet (default 50)")
    gen.add_argument("--sample-size", type=int, default=16, help="rows in sample.jsonl (default 16)")
    gen.add_argument("--force", action="store_true", help="overwrite existing files")
    imp = sub.add_parser(
        "import",
        help="turn GSM8K or Calc-X files into train/test/test_mini parquet files and sample.jsonl",
        description="Read GSM8K jsonl/parquet ({question, answer ending in '#### N'}) or Calc-X rows (id, question, "
        "chain, result, source) and write calcx's dataset files. test.parquet is the validation "
        "split (the trainer's --val-file). Bad rows stop the import (exit 1) unless --skip-invalid.",
    )
    imp.add_argument("files", nargs="+", help=".jsonl or .parquet files")
    imp.add_argument("--out", required=True, help="directory to write into (created if missing)")
    imp.add_argument(
        "--format",
        choices=FORMATS,
        default="auto",
        help="input layout (default auto: rows with 'answer' and no 'result' are GSM8K)",
    )
    imp.add_argument(
        "--val-size",
        type=int,
        default=VAL_SIZE_DEFAULT,
        help=f"rows in the validation split, test.parquet (default {VAL_SIZE_DEFAULT}: enough to tell "
        "two recipes apart, compared paired on the same rows)",
    )
    imp.add_argument("--seed", type=int, default=0, help="split seed (default 0)")
    imp.add_argument(
        "--mini-size",
        type=int,
        default=50,
        help="rows in test_mini.parquet, the head of the validation split (default 50)",
    )
    imp.add_argument(
        "--sample-size", type=int, default=16, help="rows in sample.jsonl, the head of the training split (default 16)"
    )
    imp.add_argument("--skip-invalid", action="store_true", help="write the good rows and list the bad ones skipped")
    imp.add_argument("--force", action="store_true", help="overwrite existing files")
    val = sub.add_parser("validate", help="check that files follow the Calc-X row schema")
    val.add_argument("files", nargs="+", help=".parquet or .jsonl files")
    tr = sub.add_parser(
        "traces",
        help="turn GSM8K calculator annotations into agent-format chat traces (supervised warm-up)",
        description="Read GSM8K jsonl/parquet and write one chat trace per row in the agent's own format: its "
        "system and user messages, the calculate tool called once per <<expression=result>> "
        "annotation (all in one turn, or one a turn with --tool-rounds N), the MCP calculator's "
        "answers, then the reasoning and ### ANSWER: x ###. Rows "
        "whose annotations cannot make a faithful trace are skipped and named.",
    )
    tr.add_argument("files", nargs="+", help="GSM8K .jsonl or .parquet files ({question, answer})")
    tr.add_argument("--out", required=True, help="traces file: .parquet (verl's SFT trainer) or .jsonl")
    tr.add_argument(
        "--exclude",
        nargs="+",
        default=[],
        metavar="FILE",
        help="rows held out of training (e.g. the validation file `calcx data import` wrote): a row "
        "whose id or question text is in them makes no trace",
    )
    tr.add_argument(
        "--tool-rounds",
        default=str(TOOL_ROUNDS_DEFAULT),
        metavar="N",
        help="the agent's calcx.agent_tool_rounds: 1 (default) writes every call in one turn; N > 1 "
        "writes one call a turn, each followed by its result, and skips rows with more than N "
        f"annotations (at most {TOOL_ROUNDS_MAX})",
    )
    tr.add_argument("--force", action="store_true", help="overwrite an existing file")
    hard = sub.add_parser(
        "harden",
        help="the hard-arithmetic split: imported GSM8K rows with their numbers made large",
        description="Read imported GSM8K rows (train.parquet or test.parquet of `calcx data import`) and write "
        f"each one's hard version (source {HARD_SOURCE}, id <id>{id_suffix(HARD_SOURCE)}): the question's numbers "
        "scaled by one factor, the answer recomputed from the row's own calculator annotations through the MCP "
        "calculator. Rows whose numbers cannot all be rewritten consistently are skipped and named "
        "(all of them in OUT's .skipped.jsonl).",
    )
    hard.add_argument("files", nargs="+", help="imported Calc-X rows (.parquet or .jsonl) with GSM8K chains")
    hard.add_argument("--out", required=True, help="the hard rows: .parquet or .jsonl")
    hard.add_argument("--seed", type=int, default=0, help="factor seed (default 0)")
    hard.add_argument("--limit", type=int, default=None, help="stop after this many hard rows (default: all)")
    hard.add_argument(
        "--factor-range",
        nargs=2,
        type=int,
        default=FACTOR_RANGE,
        metavar=("LOW", "HIGH"),
        help=f"draw each problem's factor from LOW..HIGH (default {FACTOR_RANGE[0]} {FACTOR_RANGE[1]}); "
        "larger factors give larger numbers",
    )
    hard.add_argument(
        "--source",
        default=HARD_SOURCE,
        metavar="NAME",
        help=f"the rows' source, gsm8k-<tag> (default {HARD_SOURCE}); their ids end in -<tag>, so that a split "
        "made with another --factor-range is validated and reported beside this one, not mixed with it",
    )
    hard.add_argument("--force", action="store_true", help="overwrite an existing file")
    return parser


def _generate(args: argparse.Namespace) -> int:
    from calcx.data.generator import generate_dataset
    from calcx.data.io import write_jsonl, write_parquet

    for name in ("train_size", "test_size", "mini_size", "sample_size"):
        if getattr(args, name) < 0:
            print(f"calcx data: error: --{name.replace('_', '-')} must be >= 0", file=sys.stderr)
            return 2
    out = Path(args.out)
    targets = [out / n for n in ("train.parquet", "test.parquet", "test_mini.parquet", "sample.jsonl")]
    existing = [str(t) for t in targets if t.exists()]
    if existing and not args.force:
        print(f"calcx data: error: {', '.join(existing)} already exist; pass --force to overwrite", file=sys.stderr)
        return 2
    try:
        splits = generate_dataset(args.seed, args.train_size, args.test_size, args.mini_size)
    except ValueError as exc:
        print(f"calcx data: error: {exc}", file=sys.stderr)
        return 2
    write_parquet(splits["train"], targets[0])
    write_parquet(splits["test"], targets[1])
    write_parquet(splits["test_mini"], targets[2])
    write_jsonl(splits["train"][: args.sample_size], targets[3])
    sizes = [
        len(splits["train"]),
        len(splits["test"]),
        len(splits["test_mini"]),
        min(args.sample_size, len(splits["train"])),
    ]
    for target, size in zip(targets, sizes):
        print(f"wrote {target} ({size} rows)")
    return 0


def _out_problem(out: Path, suffixes: tuple[str, ...], force: bool) -> str | None:
    """Why `out` cannot be written (a suffix other than `suffixes`, or a file there without --force)."""
    if out.suffix not in suffixes:
        return f"--out {out} must end in {' or '.join(suffixes)}"
    if out.exists() and not force:
        return f"{out} already exists; pass --force to overwrite"
    return None


def _report_skipped(skipped: list, note: str = ":") -> None:
    """`skipped N rows (reason count, ...)<note>` and the first of them, on stderr."""
    if not skipped:
        return
    reasons: dict[str, int] = {}
    for item in skipped:
        reasons[item.reason] = reasons.get(item.reason, 0) + 1
    shown = ", ".join(f"{reason} {count}" for reason, count in sorted(reasons.items()))
    print(f"calcx data: skipped {len(skipped)} row{'s' if len(skipped) != 1 else ''} ({shown}){note}", file=sys.stderr)
    _list_problems(skipped)


def _list_problems(problems: list) -> None:
    for problem in problems[:SHOWN_PROBLEMS]:
        print(f"  {problem}", file=sys.stderr)
    if len(problems) > SHOWN_PROBLEMS:
        print(f"  ... and {len(problems) - SHOWN_PROBLEMS} more", file=sys.stderr)


def _import(args: argparse.Namespace) -> int:
    from calcx.data.importers import import_files, output_paths, split_rows, write_dataset
    from calcx.data.schema import DataError

    for name in ("mini_size", "sample_size"):
        if getattr(args, name) < 0:
            print(f"calcx data: error: --{name.replace('_', '-')} must be >= 0", file=sys.stderr)
            return 2
    existing = [str(t) for t in output_paths(args.out) if t.exists()]
    if existing and not args.force:
        print(f"calcx data: error: {', '.join(existing)} already exist; pass --force to overwrite", file=sys.stderr)
        return 2
    try:
        result = import_files(args.files, args.format)
    except DataError as exc:
        print(f"calcx data: error: {exc}", file=sys.stderr)
        return 2
    bad = len(result.problems)
    if bad and not args.skip_invalid:
        print(
            f"calcx data: error: {bad} bad row{'s' if bad != 1 else ''} in {result.read} read; nothing written. "
            "Fix them, or pass --skip-invalid to write the good rows:",
            file=sys.stderr,
        )
        _list_problems(result.problems)
        return 1
    if not result.rows:
        print(f"calcx data: error: no good rows in {', '.join(args.files)}", file=sys.stderr)
        return 1
    try:
        train, validation = split_rows(result.rows, args.val_size, args.seed)
    except DataError as exc:
        print(f"calcx data: error: {exc}", file=sys.stderr)
        return 2
    if bad:
        print(f"calcx data: skipped {bad} bad row{'s' if bad != 1 else ''}:", file=sys.stderr)
        _list_problems(result.problems)
    written = write_dataset(train, validation, args.out, mini_size=args.mini_size, sample_size=args.sample_size)
    for target, size in written:
        print(f"wrote {target} ({size} rows)")
    files = len(args.files)
    print(
        f"imported {result.read} rows read from {files} file{'s' if files != 1 else ''}: {len(train)} train, "
        f"{len(validation)} validation, {bad} skipped"
    )
    return 0


def _validate(args: argparse.Namespace) -> int:
    from calcx.data.io import read_rows
    from calcx.data.schema import DataError

    failed = 0
    for name in args.files:
        try:
            rows = read_rows(name)
        except DataError as exc:
            print(f"calcx data: error: {exc}", file=sys.stderr)
            failed += 1
            continue
        print(f"{name}: {len(rows)} rows ok")
    return 1 if failed else 0


def exclude_rows(rows: list[dict], origins: list[str], exclude: list[str]) -> tuple[list[dict], list[str], list]:
    """(rows kept, their origins, the held-out rows as `held_out` skips): a row is held out when
    its id or its question text is in one of the `exclude` files (`calcx.data.held_out`)."""
    from calcx.data.held_out import HeldOut
    from calcx.data.traces import Skipped

    held = HeldOut.read(exclude)
    kept, kept_origins, held_out = [], [], []
    for row, where in zip(rows, origins):
        if held.holds(row):
            held_out.append(Skipped(where, "held_out", f"{row['id']} is in --exclude"))
            continue
        kept.append(row)
        kept_origins.append(where)
    return kept, kept_origins, held_out


def _traces(args: argparse.Namespace) -> int:
    from calcx.data.importers import import_files
    from calcx.data.schema import DataError
    from calcx.data.traces import TRACE_SUFFIXES, Skipped, build_traces, write_traces

    try:
        tool_rounds = parse_tool_rounds(args.tool_rounds, what="--tool-rounds")
    except ValueError as exc:
        print(f"calcx data: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    problem = _out_problem(out, TRACE_SUFFIXES, args.force)
    if problem is not None:
        print(f"calcx data: error: {problem}", file=sys.stderr)
        return 2
    try:
        imported = import_files(args.files, "gsm8k")
    except DataError as exc:
        print(f"calcx data: error: {exc}", file=sys.stderr)
        return 2
    origins = [f"{o.file}: {o.unit} {o.line}" for o in imported.origins]
    try:
        rows, origins, held_out = exclude_rows(imported.rows, origins, args.exclude)
    except (DataError, OSError) as exc:
        print(f"calcx data: error: --exclude: {exc}", file=sys.stderr)
        return 2
    result = build_traces(rows, origins, tool_rounds)
    skipped = (
        [
            Skipped(f"{p.file}: {p.unit} {p.line}", "bad_row", f"field '{p.field}' {p.reason}" if p.field else p.reason)
            for p in imported.problems
        ]
        + held_out
        + result.skipped
    )
    _report_skipped(skipped)
    if not result.traces:
        print(f"calcx data: error: no row of {', '.join(args.files)} made a trace; nothing written", file=sys.stderr)
        return 1
    write_traces(result.traces, out)
    print(
        f"wrote {out} ({len(result.traces)} traces, {result.calls} calculator calls); "
        f"{imported.read} rows read, {len(result.traces)} kept, {len(skipped)} skipped"
    )
    return 0


def _harden(args: argparse.Namespace) -> int:
    import json

    from calcx.data.hard import harden_rows
    from calcx.data.hard_split import split_problem
    from calcx.data.io import SUFFIXES, read_rows, write_rows
    from calcx.data.schema import DataError

    out = Path(args.out)
    problem = _out_problem(out, SUFFIXES, args.force)
    if problem is not None:
        print(f"calcx data: error: {problem}", file=sys.stderr)
        return 2
    if args.limit is not None and args.limit < 1:
        print("calcx data: error: --limit must be at least 1", file=sys.stderr)
        return 2
    low, high = args.factor_range
    problem = split_problem((low, high), args.source)
    if problem is not None:
        print(f"calcx data: error: {problem}", file=sys.stderr)
        return 2
    rows, origins = [], []
    try:
        for name in args.files:
            file_rows = read_rows(name)
            rows += file_rows
            origins += [f"{name}: row {number}" for number in range(1, len(file_rows) + 1)]
    except DataError as exc:
        print(f"calcx data: error: {exc}", file=sys.stderr)
        return 2
    result = harden_rows(rows, origins, seed=args.seed, limit=args.limit, factor_range=(low, high), source=args.source)
    skipped_path = out.with_name(f"{out.stem}.skipped.jsonl")
    _report_skipped(result.skipped, f"; all named in {skipped_path}:")
    if not result.rows:
        print(
            f"calcx data: error: no row of {', '.join(args.files)} could be made hard; nothing written", file=sys.stderr
        )
        return 1
    write_rows(result.rows, out)
    skipped_path.write_text(
        "".join(json.dumps({"where": s.where, "reason": s.reason, "detail": s.detail}) + "\n" for s in result.skipped),
        encoding="utf-8",
    )
    print(
        f"wrote {out} ({len(result.rows)} hard rows, {result.calls} calculator calls); "
        f"{len(rows)} rows read, {len(result.skipped)} skipped"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "generate":
        return _generate(args)
    if args.command == "import":
        return _import(args)
    if args.command == "traces":
        return _traces(args)
    if args.command == "harden":
        return _harden(args)
    return _validate(args)


if __name__ == "__main__":
    sys.exit(main())
