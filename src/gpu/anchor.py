"""The anchor for the GPU run: verl's own single-turn GRPO loop on the same rows, model, batch
and lengths as calcx's agent run, with the same reward, so calcx's step time can be reported as a
ratio to it.

    python3 src/gpu/anchor.py data --src data/calcx/train.parquet --out runs/anchor/train.parquet
    # verl: reward.custom_reward_function.path=src/gpu/anchor.py reward.custom_reward_function.name=compute_score

The prompt is what the agent's user turn holds (system message + question + answer format), with
no tools: one model call per sample, scored by calcx's reward.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from calcx.agent.answer import SYSTEM_MESSAGE, build_task, extract_answer  # noqa: E402
from calcx.agent.reward import reward  # noqa: E402


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **_: object) -> float:
    """verl's custom reward hook: calcx's Calc-X reward on the extracted answer."""
    return float(reward(extract_answer(solution_str), str(ground_truth)))


def write_data(src: Path, out: Path) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from calcx.data.io import read_rows

    records = []
    for index, row in enumerate(read_rows(src)):
        records.append({
            "data_source": str(row.get("source") or "calcx"),
            "prompt": [
                {"role": "system", "content": SYSTEM_MESSAGE},
                {"role": "user", "content": build_task(str(row["question"]))},
            ],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(row["result"])},
            "extra_info": {"index": index, "id": str(row["id"])},
        })
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
