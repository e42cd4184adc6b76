"""The first anchor (the SmolLM2-135M run, results/gpu-run/smollm2-135m): verl's own single-turn GRPO
loop on the same rows, model, batch and lengths as calcx's agent run, with the same reward. The
anchor now is `calcx anchor train` (verl's ToolAgentLoop with the calculator, docs/anchor.md);
this script keeps the single-turn variant, with the same prompt and reward function.

    python3 src/gpu/anchor.py data --src data/calcx/train.parquet --out runs/anchor/train.parquet
    # verl: reward.custom_reward_function.path=src/gpu/anchor.py reward.custom_reward_function.name=compute_score

The prompt is what the agent's first model call holds (system message, then the question with the
answer format), with no tools: one model call per sample, scored by calcx's reward.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from calcx.anchor.data import prompt_messages  # noqa: E402
from calcx.anchor.reward import compute_score  # noqa: E402,F401  (verl loads it from this file by name)
from calcx.trainer.run.data import verl_record  # noqa: E402

# verl 0.9.1's registered single-turn agent loop (its default)
SINGLE_TURN_AGENT = "single_turn_agent"


def write_data(src: Path, out: Path) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from calcx.data.io import read_rows

    records = [
        verl_record(row, index, prompt=prompt_messages(str(row["question"])), agent_name=SINGLE_TURN_AGENT)
        for index, row in enumerate(read_rows(src))
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), out)
    return len(records)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    data = sub.add_parser("data", help="write verl's single-turn layout of a Calc-X file")
    data.add_argument("--src", type=Path, required=True)
    data.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    count = write_data(args.src, args.out)
    print(f"wrote {count} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
