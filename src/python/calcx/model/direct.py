"""GGUF weights straight to safetensors: numpy and the gguf package, no model in memory.

transformers' route (dequantize into a float32 model, copy it into a fresh one, cast, save) takes
~95 s for a 1.5B model on 16 cores, nearly all of it single-threaded. Here each tensor is cut into
row ranges that worker processes dequantize with gguf's own numpy code (the code transformers
calls), round to bf16 as torch does, and write at their final offsets in a preallocated
safetensors file. The values are the same bits transformers' route writes; `--via transformers`
keeps that route for checking.

Only architectures whose GGUF tensors transformers loads as they are (no permutation: qwen2,
not llama) are named in HF_NAMES; others go through transformers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

# GGUF name -> Hugging Face name, per architecture; "{}" is the layer number. transformers maps
# names through gguf's TensorNameMap over the model's state dict; the tests check this table
# against that map. qwen2's tensors need no reshaping (transformers has no TensorProcessor for it).
HF_NAMES: dict[str, dict[str, str]] = {
    "qwen2": {
        "token_embd.weight": "model.embed_tokens.weight",
        "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight",
        "blk.{}.attn_norm.weight": "model.layers.{}.input_layernorm.weight",
        "blk.{}.attn_q.weight": "model.layers.{}.self_attn.q_proj.weight",
        "blk.{}.attn_q.bias": "model.layers.{}.self_attn.q_proj.bias",
        "blk.{}.attn_k.weight": "model.layers.{}.self_attn.k_proj.weight",
        "blk.{}.attn_k.bias": "model.layers.{}.self_attn.k_proj.bias",
        "blk.{}.attn_v.weight": "model.layers.{}.self_attn.v_proj.weight",
        "blk.{}.attn_v.bias": "model.layers.{}.self_attn.v_proj.bias",
        "blk.{}.attn_output.weight": "model.layers.{}.self_attn.o_proj.weight",
        "blk.{}.ffn_norm.weight": "model.layers.{}.post_attention_layernorm.weight",
        "blk.{}.ffn_gate.weight": "model.layers.{}.mlp.gate_proj.weight",
        "blk.{}.ffn_up.weight": "model.layers.{}.mlp.up_proj.weight",
        "blk.{}.ffn_down.weight": "model.layers.{}.mlp.down_proj.weight",
    },
}
OPTIONAL = {"output.weight"}  # absent: the lm head is tied to the embedding and not written
SAFETENSORS_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
ITEM_SIZE = {"bfloat16": 2, "float16": 2, "float32": 4}
CHUNK_ELEMENTS = 1 << 24  # rows per work item: ~64 MB of float32 at a time per worker


class MappingError(ValueError):
    """The GGUF's tensors do not fit the architecture's table (missing or unknown names)."""


def hf_names(architecture: str, gguf_names: list[str], layers: int) -> dict[str, str]:
    """GGUF tensor name -> Hugging Face name for every tensor, or MappingError naming the misfits."""
    table = HF_NAMES[architecture]
    wanted: dict[str, str] = {}
    for gguf_pattern, hf_pattern in table.items():
        if "{}" in gguf_pattern:
            wanted |= {gguf_pattern.format(i): hf_pattern.format(i) for i in range(layers)}
        else:
            wanted[gguf_pattern] = hf_pattern
    unknown = sorted(set(gguf_names) - set(wanted))
    missing = sorted(set(wanted) - set(gguf_names) - OPTIONAL)
    if unknown or missing:
        raise MappingError(f"missing {missing}, unexpected {unknown}")
    return {name: wanted[name] for name in gguf_names}


def to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounded to nearest even as torch's cast does.

    NaN becomes 0x7FC0 (torch's scalar rule); dequantized weights of a sound file have none.
    """
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        rounded[nan] = 0x7FC0
    return rounded


def encode(values: np.ndarray, dtype: str) -> bytes:
    if dtype == "bfloat16":
        return to_bf16_bits(values).tobytes()
    return np.ascontiguousarray(values, dtype=np.float16 if dtype == "float16" else np.float32).tobytes()


@dataclass(frozen=True)
class Piece:
    """Rows [start, stop) of one GGUF tensor and where their converted bytes go in the output file."""

    data_offset: int  # the tensor's first byte in the GGUF
    raw_dtype: str  # numpy dtype of the stored items (uint8 for quantized blocks)
    raw_shape: tuple[int, ...]  # the stored array's shape, numpy order (rows first)
    qtype: int  # gguf.GGMLQuantizationType
    start: int
    stop: int
    out_offset: int


@dataclass(frozen=True)
class Entry:
    name: str  # Hugging Face name
    shape: tuple[int, ...]
    size: int  # bytes in the output


def header(entries: list[Entry], dtype: str) -> tuple[bytes, dict[str, int]]:
    """A safetensors header as the safetensors library writes it for torch tensors (names sorted,
    {"format": "pt"}, padded with spaces to 8 bytes), and each entry's data offset in the file."""
    layout: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offsets, position = {}, 0
    for entry in sorted(entries, key=lambda e: e.name):
        layout[entry.name] = {
            "dtype": SAFETENSORS_DTYPES[dtype],
            "shape": list(entry.shape),
            "data_offsets": [position, position + entry.size],
        }
        offsets[entry.name] = position
        position += entry.size
    text = json.dumps(layout, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    start = 8 + len(text)
    return len(text).to_bytes(8, "little") + text, {name: start + offset for name, offset in offsets.items()}


def plan(reader: Any, names: dict[str, str], dtype: str) -> tuple[list[Entry], list[Piece], bytes]:
    """The output's entries and header, and the work cut into row ranges of ~CHUNK_ELEMENTS."""
    from gguf import GGML_QUANT_SIZES

    tensors = {t.name: t for t in reader.tensors}
    entries = []
    for gguf_name, hf_name in names.items():
        tensor = tensors[gguf_name]
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        entries.append(Entry(hf_name, shape, int(tensor.n_elements) * ITEM_SIZE[dtype]))
    head, offsets = header(entries, dtype)
    pieces = []
    for gguf_name, hf_name in names.items():
        tensor = tensors[gguf_name]
        rows = tensor.data.shape[0] if tensor.data.ndim > 1 else 1
        row_elements = int(tensor.n_elements) // rows
        step = max(1, CHUNK_ELEMENTS // row_elements)
        block, type_size = GGML_QUANT_SIZES[tensor.tensor_type]
        assert tensor.n_bytes == int(tensor.n_elements) * type_size // block
        for start in range(0, rows, step):
            stop = min(rows, start + step)
            pieces.append(
                Piece(
                    int(tensor.data_offset),
                    tensor.data.dtype.str,
                    tuple(tensor.data.shape) if tensor.data.ndim > 1 else (1, *tensor.data.shape),
                    int(tensor.tensor_type),
                    start,
                    stop,
                    offsets[hf_name] + start * row_elements * ITEM_SIZE[dtype],
                )
            )
    pieces.sort(key=lambda p: p.stop - p.start, reverse=True)  # big pieces first: even finish
    return entries, pieces, head


def convert_piece(source: str, target: str, dtype: str, piece: Piece) -> int:
    """Dequantize one row range with gguf's numpy code and write its bytes in place; bytes written."""
    from gguf import GGMLQuantizationType, dequantize

    stored = np.memmap(
        source, dtype=np.dtype(piece.raw_dtype), mode="r", offset=piece.data_offset, shape=piece.raw_shape
    )
    values = dequantize(stored[piece.start : piece.stop], GGMLQuantizationType(piece.qtype))
    data = encode(values, dtype)
    fd = os.open(target, os.O_WRONLY)
    try:
        written = os.pwrite(fd, data, piece.out_offset)
    finally:
        os.close(fd)
    if written != len(data):
        raise OSError(f"{target}: short write at {piece.out_offset}")
    return written


def workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def write_weights(
    reader: Any, source: Path, names: dict[str, str], dtype: str, target: Path, jobs: int | None = None
) -> tuple[int, int]:
    """Write `target` (one safetensors file) from the GGUF's tensors; (parameters, bytes)."""
    entries, pieces, head = plan(reader, names, dtype)
    total = len(head) + sum(e.size for e in entries)
    with target.open("wb") as handle:
        handle.write(head)
        handle.truncate(total)
    jobs = min(jobs or workers(), len(pieces))
    if jobs <= 1:
        for piece in pieces:
            convert_piece(str(source), str(target), dtype, piece)
    else:
        # fork: the workers need no imports re-run and touch neither torch nor threads of the parent
        with ProcessPoolExecutor(jobs, mp_context=get_context("fork")) as pool:
            for _ in pool.map(_run, _args(source, target, dtype, pieces)):
                pass
    return sum(int(np.prod(e.shape)) for e in entries), total


def _args(source: Path, target: Path, dtype: str, pieces: list[Piece]) -> Iterator[tuple[str, str, str, Piece]]:
    return ((str(source), str(target), dtype, piece) for piece in pieces)


def _run(args: tuple[str, str, str, Piece]) -> int:
    return convert_piece(*args)
