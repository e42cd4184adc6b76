"""Token lengths of a warm-up traces file, rendered as `calcx warmup` renders them.

Each row goes through the warm-up's own dataset class (calcx.trainer.warmup.dataset.
AgentTraceDataset) with the model's tokenizer and chat template, its length bound lifted so that
every row is measured; the figures are compared with warmup.yaml's `data.max_length`, past which
the warm-up stops with a DataError.

    PYTHONPATH=src/python python benchmarks/trace_lengths.py traces.parquet --gguf MODEL.gguf
    PYTHONPATH=src/python python benchmarks/trace_lengths.py traces.parquet --tokenizer MODEL_DIR

--gguf reads the tokenizer, chat template and special tokens from a GGUF as `calcx model
from-gguf` does (the weights are not read); --tokenizer takes a model directory, such as the one
`calcx model from-gguf` writes. Needs torch, transformers, gguf and pyarrow (the `trainer` resolve).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import yaml


def gguf_tokenizer(path: str) -> Any:
    """The tokenizer `calcx model from-gguf` saves beside the weights: the GGUF's chat template and
    its bos/eos/pad tokens on transformers' GGUF tokenizer."""
    from pathlib import Path

    import gguf
    import transformers

    from calcx.model.gguf import CHAT_TEMPLATE_FIELD, name_gguf_distribution, read_metadata, set_special_tokens

    file = Path(path)
    metadata = read_metadata(gguf, file)
    if metadata.chat_template is None:
        raise SystemExit(f"{file}: has no {CHAT_TEMPLATE_FIELD}")
    name_gguf_distribution()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
    tokenizer.chat_template = metadata.chat_template
    set_special_tokens(tokenizer, metadata.special_ids)
    return tokenizer


def warmup_max_length() -> int:
    from calcx.trainer.warmup.sft import WARMUP_OVERRIDES

    return int(yaml.safe_load(WARMUP_OVERRIDES.read_text(encoding="utf-8"))["overrides"]["data"]["max_length"])


def percentile(values: list[int], q: float) -> int:
    """The nearest-rank percentile of sorted values."""
    rank = max(1, -(-len(values) * q // 100))
    return values[int(rank) - 1]


def measure(path: str, tokenizer: Any, max_length: int) -> dict[str, Any]:
    from calcx.trainer.warmup.dataset import AgentTraceDataset

    dataset = AgentTraceDataset(path, tokenizer, {"max_length": sys.maxsize})
    lengths, trained, turns, ids, over = [], [], [], [], []
    for index in range(len(dataset)):
        item = dataset[index]
        length = int(item["input_ids"].numel())
        lengths.append(length)
        ids.append(str(dataset.rows[index].get("id", index)))
        trained.append(int(item["loss_mask"].sum()))
        mask = item["loss_mask"].tolist()
        turns.append(sum(1 for at, bit in enumerate(mask) if bit and (at == 0 or not mask[at - 1])))
        if length > max_length:
            over.append(ids[-1])
    ordered = sorted(lengths)
    return {
        "traces": len(lengths),
        "tokens": {
            "p50": percentile(ordered, 50),
            "p95": percentile(ordered, 95),
            "p99": percentile(ordered, 99),
            "max": ordered[-1],
            "mean": round(sum(ordered) / len(ordered), 1),
        },
        "max_length": max_length,
        "over_max_length": len(over),
        "over": over[:20],
        "longest": sorted(zip(ids, lengths), key=lambda item: -item[1])[:3],
        "trained_tokens_mean": round(sum(trained) / len(trained), 1),
        # model turns trained per trace: the runs of the loss mask
        "trained_turns": {str(n): turns.count(n) for n in sorted(set(turns))},
        "trained_turns_mean": round(sum(turns) / len(turns), 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", help="a `calcx data traces` .parquet file")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--gguf", help="the model's GGUF file (tokenizer and chat template as from-gguf saves them)")
    source.add_argument("--tokenizer", help="model or tokenizer directory with the chat template")
    parser.add_argument("--max-length", type=int, default=None, help="default: warmup.yaml's data.max_length")
    args = parser.parse_args(argv)

    if args.gguf:
        tokenizer = gguf_tokenizer(args.gguf)
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    started = time.monotonic()
    report = measure(args.traces, tokenizer, args.max_length or warmup_max_length())
    report["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
