"""Training files: Calc-X rows -> the parquet layout verl's RLHFDataset reads.

verl reads `prompt` (chat messages) to measure and filter prompts, passes every other column to the
AgentLoop as keyword arguments, and groups validation metrics by `data_source`. The Calc-X row
itself travels as JSON in `calcx_row`, so the AgentLoop can hand it to the calcx server unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from calcx.contract.env import REL_TOL_FIELD

DEFAULT_DATA_DIR = Path("data/calcx")
DEFAULT_TRAIN = DEFAULT_DATA_DIR / "train.parquet"
DEFAULT_VAL = DEFAULT_DATA_DIR / "test_mini.parquet"
AGENT_NAME = "calcx_agent"
# one Calc-X file or several, read in order (`--train-file A B`)
Sources = str | Path | Sequence[str | Path]


def ensure_generated(path: Path) -> None:
    """Generate the default Calc-X files when the default path is asked for and absent."""
    if path.exists():
        return
    if path.parent != DEFAULT_DATA_DIR and path.parent.resolve() != DEFAULT_DATA_DIR.resolve():
        raise FileNotFoundError(f"{path} does not exist; generate it with 'calcx data generate --out {path.parent}'")
    from calcx.data.__main__ import main as data_main

    code = data_main(["generate", "--out", str(path.parent)])
    if code != 0 or not path.exists():
        raise FileNotFoundError(f"'calcx data generate --out {path.parent}' did not produce {path} (exit {code})")


def verl_record(row: dict[str, Any], index: int, *, prompt: list[dict[str, str]], agent_name: str) -> dict[str, Any]:
    """The columns verl reads from one Calc-X row: `prompt`, the agent loop that runs it, the
    `data_source` its validation metrics are grouped by, and the ground truth (with the row's own
    tolerance, when it sets one, for the anchor's reward)."""
    extra_info: dict[str, Any] = {"index": index, "id": str(row["id"])}
    if REL_TOL_FIELD in row:
        extra_info[REL_TOL_FIELD] = row[REL_TOL_FIELD]
    return {
        "prompt": prompt,
        "data_source": str(row.get("source") or "calcx"),
        "agent_name": agent_name,
        "reward_model": {"style": "rule", "ground_truth": str(row["result"])},
        "extra_info": extra_info,
    }


def verl_records(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    records = []
    for index, row in enumerate(rows):
        records.append(
            {
                **verl_record(
                    row, index, prompt=[{"role": "user", "content": str(row["question"])}], agent_name=AGENT_NAME
                ),
                "calcx_row": json.dumps(row, ensure_ascii=False, sort_keys=True),
            }
        )
    return records


def read_sources(srcs: Sources) -> list[dict[str, Any]]:
    """The rows of one or more Calc-X parquet/jsonl files, in order (each validated); ValueError
    when a file has no rows or an id repeats (verl's metrics and calcx's store key a
    row by its id)."""
    from calcx.data.io import read_rows

    paths = [srcs] if isinstance(srcs, str | Path) else list(srcs)
    rows: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    for path in paths:
        file_rows = read_rows(path)
        if not file_rows:
            raise ValueError(f"{path} has no rows; nothing to train on")
        for row in file_rows:
            first = seen.get(str(row["id"]))
            if first is not None:
                raise ValueError(f"{path}: row id {row['id']!r} is also in {first}; ids must be unique")
            seen[str(row["id"])] = str(path)
        rows.extend(file_rows)
    return rows


def to_verl_parquet(
    srcs: Sources, dst: str | Path, records: Callable[[Sequence[dict[str, Any]]], list[dict[str, Any]]] = verl_records
) -> Path:
    """Read (and validate) one or more Calc-X parquet/jsonl files and write `records(rows)` to `dst`
    (verl's layout for calcx's agent loop unless another is given)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = read_sources(srcs)
    out = Path(dst)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records(rows)), out)
    return out
