"""calcx.model.direct without torch: the bf16 rounding, the name table against gguf's own map, and
the safetensors file it writes from a tiny Q4_K/Q6_K/F32 GGUF (test_model_gguf.py compares the
whole output with the transformers route where torch is installed)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the trainer resolve provides gguf")

from tiny_gguf import K_LAYERS, kquant_layout, write_kquant_qwen2  # noqa: E402

from calcx.model import direct  # noqa: E402


def bits(*words: int) -> np.ndarray:
    return np.array(words, dtype=np.uint32).view(np.float32)


def nearest_even_reference(values: np.ndarray) -> np.ndarray:
    """bf16 by exact arithmetic: of the two bf16 values around x, the nearer; on a tie, the even one."""
    words = values.view(np.uint32)
    low = (words >> 16).astype(np.uint16)
    high = low + np.uint16(1)

    def value(halves: np.ndarray) -> np.ndarray:
        # the neighbour past the largest bf16 is inf, worth 2**128 for rounding (IEEE overflow)
        exact = (halves.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        return np.where(np.isinf(exact), np.copysign(2.0**128, exact), exact)

    exact = values.astype(np.float64)
    below, above = np.abs(exact - value(low)), np.abs(value(high) - exact)
    pick_high = (above < below) | ((above == below) & (low % 2 == 1))
    return np.where(pick_high, high, low)


def test_bf16_rounds_to_nearest_even_at_the_edges():
    cases = {
        0x3F800000: 0x3F80,  # 1.0
        0x3F808000: 0x3F80,  # halfway, even below
        0x3F818000: 0x3F82,  # halfway, even above
        0x3F808001: 0x3F81,  # just past halfway
        0x3F807FFF: 0x3F80,  # just short of it
        0xBF818000: 0xBF82,  # negative ties alike
        0x80000000: 0x8000,  # -0.0
        0x7F7FFFFF: 0x7F80,  # the largest float32 rounds to inf, as torch's cast
        0x7F800000: 0x7F80,  # inf
        0x00018000: 0x0002,  # subnormal tie
        0x7FC00001: 0x7FC0,  # NaN: torch's quiet NaN
        0xFFFFFFFF: 0x7FC0,  # NaN whose rounding would carry out of 32 bits
    }
    got = direct.to_bf16_bits(bits(*cases))
    assert [hex(v) for v in got] == [hex(v) for v in cases.values()]


def test_bf16_matches_exact_rounding_on_random_floats():
    rng = np.random.default_rng(3)
    words = rng.integers(0, 0x7F800000, 200_000, dtype=np.uint32)  # finite, every exponent
    words[::2] |= np.uint32(0x80000000)
    words[::7] = (words[::7] & np.uint32(0xFFFF0000)) | np.uint32(0x8000)  # many exact ties
    words[:64] = np.uint32(0x7F7F7FE0) + np.arange(64, dtype=np.uint32)  # around the overflow to inf
    values = words.view(np.float32)
    assert np.array_equal(direct.to_bf16_bits(values), nearest_even_reference(values))


def test_the_name_table_is_gguf_s_own_map_reversed():
    # transformers maps a HF parameter to its GGUF tensor with gguf's TensorNameMap; the table must agree
    assert gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.QWEN2] == "qwen2"
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, K_LAYERS)
    names = direct.hf_names("qwen2", list(kquant_layout()), K_LAYERS)
    assert len(set(names.values())) == len(names) == 3 + 12 * K_LAYERS
    for gguf_name, hf_name in names.items():
        base, suffix = hf_name.rsplit(".", 1)
        assert name_map.get_name(base) + "." + suffix == gguf_name, hf_name


def test_missing_and_unknown_tensors_are_named():
    names = list(kquant_layout())
    tied = direct.hf_names("qwen2", [n for n in names if n != "output.weight"], K_LAYERS)
    assert "lm_head.weight" not in tied.values()  # tied to the embedding: nothing to write
    with pytest.raises(
        direct.MappingError, match=r"missing \['blk.1.ffn_up.weight'\], unexpected \['rope_freqs.weight'\]"
    ):
        direct.hf_names("qwen2", [n for n in names if n != "blk.1.ffn_up.weight"] + ["rope_freqs.weight"], K_LAYERS)
    with pytest.raises(direct.MappingError, match="blk.2.attn_q.weight"):
        direct.hf_names("qwen2", names, K_LAYERS + 1)


def read_safetensors(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + size]), raw[8 + size :]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_weights_file_holds_every_tensor_converted(tmp_path, monkeypatch, dtype):
    source = tmp_path / "tiny.gguf"
    values = write_kquant_qwen2(gguf, source)
    monkeypatch.setattr(direct, "CHUNK_ELEMENTS", 256 * 100)  # several row ranges per matrix
    reader = gguf.GGUFReader(str(source))
    names = direct.hf_names("qwen2", [t.name for t in reader.tensors], K_LAYERS)
    target = tmp_path / "model.safetensors"
    parameters, size = direct.write_weights(reader, source, names, dtype, target, jobs=2)

    head, data = read_safetensors(target)
    assert head.pop("__metadata__") == {"format": "pt"}
    assert list(head) == sorted(names.values())
    assert parameters == sum(v.size for v in values.values()) and size == target.stat().st_size
    position = 0
    for gguf_name, hf_name in names.items():
        entry = head[hf_name]
        assert entry["dtype"] == direct.SAFETENSORS_DTYPES[dtype]
        assert entry["shape"] == list(values[gguf_name].shape)
    for entry in head.values():  # contiguous, in name order, to the end of the file
        assert entry["data_offsets"][0] == position
        position = entry["data_offsets"][1]
    assert position == len(data)
    expected_dtype = {"bfloat16": np.uint16, "float16": np.float16, "float32": np.float32}[dtype]
    for gguf_name, hf_name in names.items():
        start, stop = head[hf_name]["data_offsets"]
        stored = np.frombuffer(data[start:stop], dtype=expected_dtype).reshape(values[gguf_name].shape)
        if dtype == "bfloat16":
            expected = nearest_even_reference(values[gguf_name])
        else:
            expected = values[gguf_name].astype(expected_dtype)
        assert np.array_equal(stored, expected), hf_name
