"""`calcx runs index`: write (or, with --check, compare) results/INDEX.md from the run records."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from calcx.runs.index import records, render_index
from calcx.runs.record import RecordError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="calcx runs", description="Committed GPU runs as records.")
    sub = parser.add_subparsers(dest="command", required=True)
    index = sub.add_parser("index", help="results/INDEX.md from results/runs/*/run.yaml")
    index.add_argument("--root", type=Path, default=Path("results/runs"), help="the runs' folder (default results/runs)")
    index.add_argument("--out", type=Path, default=Path("results/INDEX.md"), help="the index (default results/INDEX.md)")
    index.add_argument("--check", action="store_true", help="exit 1 when the index is not what the records make")
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
