"""A tiny GGUF's tokenizer parts, and a tiny qwen2 GGUF stored as Q4_K_M stores Qwen2.5 (Q4_K and
Q6_K matrices, F32 norms and biases), written with the gguf package alone (no torch)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "2"), ("=", "=")]

# K-quant blocks hold 256 values, so every matrix's rows are a multiple of 256 long
K_HIDDEN, K_HEADS, K_KV_HEADS, K_LAYERS, K_FFN = 256, 4, 2, 2, 512
K_KV = K_KV_HEADS * K_HIDDEN // K_HEADS


def byte_level_alphabet() -> list[str]:
    """GPT-2's byte-to-unicode table: the 256 single-character tokens of a byte-level BPE."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    codes, extra = printable[:], 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    table = dict(zip(printable, codes))
    return [chr(table[b]) for b in range(256)]


def tokens() -> list[str]:
    return byte_level_alphabet() + ["".join(pair) for pair in MERGES] + SPECIALS


def add_tokenizer(gguf, writer, arch: str) -> None:
    vocab = tokens()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2" if arch == "qwen2" else "llama-bpe")
    writer.add_token_list(vocab)
    writer.add_token_types([gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL for t in vocab])
    writer.add_token_merges([f"{a} {b}" for a, b in MERGES])
    writer.add_bos_token_id(vocab.index("<|endoftext|>"))
    writer.add_eos_token_id(vocab.index("<|im_end|>"))


def kquant_blocks(gguf, qtype, rows: int, columns: int, rng: np.random.Generator) -> np.ndarray:
    """Random K-quant blocks with finite, small scales: (rows, bytes per row) uint8, as GGUF stores them."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (rows * columns // block, size), dtype=np.uint8)
    scale = (rng.uniform(1e-3, 1e-2, (blocks.shape[0], 1))).astype(np.float16).view(np.uint8)
    if qtype == gguf.GGMLQuantizationType.Q4_K:  # d and dmin lead the block
        blocks[:, 0:2], blocks[:, 2:4] = scale, scale[::-1]
    else:  # Q6_K: d ends it
        blocks[:, -2:] = scale
    return blocks.reshape(rows, columns // block * size)


def kquant_layout() -> dict[str, tuple[str, tuple[int, ...]]]:
    """GGUF tensor name -> (storage type, shape in numpy order)."""
    vocab = len(tokens())
    layout = {
        "token_embd.weight": ("Q4_K", (vocab, K_HIDDEN)),
        "output_norm.weight": ("F32", (K_HIDDEN,)),
        "output.weight": ("Q6_K", (vocab, K_HIDDEN)),
    }
    for i in range(K_LAYERS):
        b = f"blk.{i}."
        layout |= {
            b + "attn_norm.weight": ("F32", (K_HIDDEN,)),
            b + "attn_q.weight": ("Q4_K", (K_HIDDEN, K_HIDDEN)),
            b + "attn_q.bias": ("F32", (K_HIDDEN,)),
            b + "attn_k.weight": ("Q4_K", (K_KV, K_HIDDEN)),
            b + "attn_k.bias": ("F32", (K_KV,)),
            b + "attn_v.weight": ("Q6_K", (K_KV, K_HIDDEN)),
            b + "attn_v.bias": ("F32", (K_KV,)),
            b + "attn_output.weight": ("Q4_K", (K_HIDDEN, K_HIDDEN)),
            b + "ffn_norm.weight": ("F32", (K_HIDDEN,)),
            b + "ffn_gate.weight": ("Q4_K", (K_FFN, K_HIDDEN)),
            b + "ffn_up.weight": ("Q4_K", (K_FFN, K_HIDDEN)),
            b + "ffn_down.weight": ("Q6_K", (K_HIDDEN, K_FFN)),
        }
    return layout


def write_kquant_qwen2(
    gguf, path: Path, *, skip: tuple[str, ...] = (), extra: tuple[str, ...] = (), tokenizer: bool = True
) -> dict[str, np.ndarray]:
    """Write the tiny Q4_K_M-like qwen2 GGUF (less `skip`, plus F32 tensors named `extra`; without
    `tokenizer`, a token list of a tokenizer model no one knows); returns each tensor's values as gguf
    dequantizes them (float32)."""
    rng = np.random.default_rng(11)
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_name("tiny qwen2 q4_k_m")
    writer.add_context_length(256)
    writer.add_embedding_length(K_HIDDEN)
    writer.add_block_count(K_LAYERS)
    writer.add_feed_forward_length(K_FFN)
    writer.add_head_count(K_HEADS)
    writer.add_head_count_kv(K_KV_HEADS)
    writer.add_rope_freq_base(1000000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    if tokenizer:
        add_tokenizer(gguf, writer, "qwen2")
    else:
        writer.add_tokenizer_model("no-such-model")
        writer.add_token_list(tokens())
    writer.add_chat_template(CHAT_TEMPLATE)
    values = {}
    layout = kquant_layout() | {name: ("F32", (K_HIDDEN,)) for name in extra}
    for name, (kind, shape) in layout.items():
        if name in skip:
            continue
        if kind == "F32":
            data = (rng.standard_normal(shape) * 0.1).astype(np.float32)
            writer.add_tensor(name, data)
            values[name] = data
        else:
            qtype = getattr(gguf.GGMLQuantizationType, kind)
            rows, columns = shape
            blocks = kquant_blocks(gguf, qtype, rows, columns, rng)
            writer.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=qtype)
            values[name] = gguf.quants.dequantize(blocks, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return values
