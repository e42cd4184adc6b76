"""`calcx model from-gguf` on a tiny GGUF this test writes itself (qwen2 and llama).

The tiny file has the real format's parts (F32 tensors with known random values, a byte-level
BPE tokenizer, a chat template), so the conversion runs the same transformers code as for
Qwen2.5-Coder-1.5B, in seconds and without a download.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the trainer resolve provides gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tiny_gguf import CHAT_TEMPLATE, add_tokenizer, tokens, write_kquant_qwen2  # noqa: E402

from calcx.model.__main__ import main  # noqa: E402  (what `calcx model` runs)

HIDDEN, HEADS, KV_HEADS, LAYERS, FFN = 64, 4, 2, 2, 128
HEAD_DIM = HIDDEN // HEADS
TEXT = "Hello, the cat in 2 + 2 == 4!"


def source_tensors(arch: str, vocab: int) -> dict[str, np.ndarray]:
    """GGUF tensor name -> values; qwen2 has q/k/v biases and its own lm head, llama ties it."""
    rng = np.random.default_rng(7)

    def t(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32) * 0.1

    tensors = {"token_embd.weight": t(vocab, HIDDEN), "output_norm.weight": 1 + t(HIDDEN)}
    if arch == "qwen2":
        tensors["output.weight"] = t(vocab, HIDDEN)
    for i in range(LAYERS):
        b = f"blk.{i}."
        tensors |= {
            b + "attn_norm.weight": 1 + t(HIDDEN),
            b + "attn_q.weight": t(HIDDEN, HIDDEN),
            b + "attn_k.weight": t(KV_HEADS * HEAD_DIM, HIDDEN),
            b + "attn_v.weight": t(KV_HEADS * HEAD_DIM, HIDDEN),
            b + "attn_output.weight": t(HIDDEN, HIDDEN),
            b + "ffn_norm.weight": 1 + t(HIDDEN),
            b + "ffn_gate.weight": t(FFN, HIDDEN),
            b + "ffn_up.weight": t(FFN, HIDDEN),
            b + "ffn_down.weight": t(HIDDEN, FFN),
        }
        if arch == "qwen2":
            tensors |= {
                b + "attn_q.bias": t(HIDDEN),
                b + "attn_k.bias": t(KV_HEADS * HEAD_DIM),
                b + "attn_v.bias": t(KV_HEADS * HEAD_DIM),
            }
    return tensors


HF_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def hf_name(gguf_name: str) -> str:
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{HF_NAMES[parts[2]]}.{parts[3]}"
    return f"{HF_NAMES[parts[0]]}.{parts[1]}"


def write_gguf(
    path: Path, arch: str, *, chat_template: str | None = CHAT_TEMPLATE, q8_0: bool = False
) -> dict[str, np.ndarray]:
    """Write the tiny model; with ``q8_0`` its matrices are stored Q8_0-quantized (like a real GGUF)."""
    vocab = tokens()
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny {arch}")
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if q8_0 else gguf.LlamaFileType.ALL_F32)
    add_tokenizer(gguf, writer, arch)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    tensors = source_tensors(arch, len(vocab))
    for name, values in tensors.items():
        if q8_0 and values.ndim == 2:
            blocks = gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            tensors[name] = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tensors


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def converted(request, tmp_path_factory):
    arch = request.param
    root = tmp_path_factory.mktemp(arch)
    source = root / f"tiny-{arch}.gguf"
    tensors = write_gguf(source, arch)
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    out = root / "model"
    code = main(["from-gguf", "--gguf", str(source), "--out", str(out), "--sha256", digest.upper()])
    assert code == 0
    return arch, source, tensors, out


def read_from_gguf(source: Path):
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(source.parent), gguf_file=source.name, dtype=torch.float32
    )


def test_config_has_the_architecture_and_sizes(converted):
    arch, _, _, out = converted
    config = transformers.AutoConfig.from_pretrained(out)
    assert config.model_type == arch
    assert config.architectures == ["Qwen2ForCausalLM" if arch == "qwen2" else "LlamaForCausalLM"]
    assert (
        config.hidden_size,
        config.num_hidden_layers,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.intermediate_size,
    ) == (HIDDEN, LAYERS, HEADS, KV_HEADS, FFN)
    assert config.vocab_size == len(tokens())
    assert config.tie_word_embeddings is (arch == "llama")
    assert getattr(config, "quantization_config", None) is None


def test_weights_are_bf16_on_disk_and_equal_the_gguf_tensors(converted):
    from safetensors import safe_open

    arch, source, tensors, out = converted
    files = sorted(out.glob("*.safetensors"))
    assert files, f"no safetensors in {sorted(p.name for p in out.iterdir())}"
    on_disk: dict[str, Any] = {}  # name -> torch tensor
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            on_disk |= {name: handle.get_tensor(name) for name in handle.keys()}
    assert {t.dtype for t in on_disk.values()} == {torch.bfloat16}

    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    saved = model.state_dict()
    reference = read_from_gguf(source).state_dict()  # after the GGUF loader's own permutations
    assert set(saved) == set(reference)
    for name, value in reference.items():
        assert saved[name].dtype == torch.bfloat16, name
        assert torch.equal(saved[name], value.to(torch.bfloat16)), name
    # Tensors the loader does not permute must be the very values written into the file.
    permuted = ("attn_q.", "attn_k.") if arch == "llama" else ()
    for name, values in tensors.items():
        if any(p in name for p in permuted):
            continue
        assert torch.equal(saved[hf_name(name)], torch.from_numpy(values).to(torch.bfloat16)), name
    if arch == "llama":
        assert torch.equal(saved["lm_head.weight"], saved["model.embed_tokens.weight"])
        assert "lm_head.weight" not in on_disk  # tied: written once, as the embedding


def test_tokenizer_keeps_the_chat_template_and_round_trips(converted):
    _, _, _, out = converted
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template == CHAT_TEMPLATE
    # the GGUF's own special tokens, not the ones transformers' converters pick
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<|endoftext|>", "<|im_end|>")
    assert tokenizer.eos_token_id == transformers.AutoConfig.from_pretrained(out).eos_token_id
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    assert tokenizer.decode(ids) == TEXT
    assert tokenizer.convert_tokens_to_ids("Ġthe") in ids  # the merges were applied
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "2+2?"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"


def test_float32_keeps_the_exact_values(tmp_path):
    source = tmp_path / "tiny.gguf"
    tensors = write_gguf(source, "qwen2")
    out = tmp_path / "model32"
    assert main(["from-gguf", "--gguf", str(source), "--out", str(out), "--dtype", "float32"]) == 0
    saved = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    for name, values in tensors.items():
        assert torch.equal(saved[hf_name(name)], torch.from_numpy(values)), name


def test_a_quantized_gguf_is_dequantized(tmp_path):
    source = tmp_path / "tiny-q8_0.gguf"
    tensors = write_gguf(source, "qwen2", q8_0=True)  # values: what the Q8_0 blocks dequantize to
    out = tmp_path / "model"
    assert main(["from-gguf", "--gguf", str(source), "--out", str(out), "--dtype", "float32"]) == 0
    saved = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    original = source_tensors("qwen2", len(tokens()))["output.weight"]
    assert not torch.equal(saved["lm_head.weight"], torch.from_numpy(original))  # Q8_0 changed the values
    for name, values in tensors.items():
        assert torch.equal(saved[hf_name(name)], torch.from_numpy(values)), name


def test_converts_where_no_record_names_the_gguf_module(tmp_path, monkeypatch):
    # a PEX venv: the distributions' RECORD files list no modules, so transformers' module ->
    # distribution map has no entry for gguf (on the GPU machine: "Invalid version: 'N/A'")
    from transformers.utils import import_utils

    monkeypatch.delitem(import_utils.PACKAGE_DISTRIBUTION_MAPPING, "gguf", raising=False)
    source = tmp_path / "tiny.gguf"
    write_gguf(source, "qwen2")
    assert main(["from-gguf", "--gguf", str(source), "--out", str(tmp_path / "model")]) == 0
    assert (tmp_path / "model" / "config.json").is_file()


def test_progress_lines_name_each_phase_with_a_time(converted, tmp_path, capsys):
    arch, source, _, _ = converted
    capsys.readouterr()
    assert main(["from-gguf", "--gguf", str(source), "--out", str(tmp_path / "m")]) == 0
    lines = capsys.readouterr().out.splitlines()
    # auto: the direct route where it applies, whose tokenizer and config are read beside the weights
    middle = ("weights:", "tokenizer and config:") if arch == "qwen2" else ("rebuild:",)
    for phase in ("verify sha256:", "read:", *middle, "save:"):
        line = next((ln for ln in lines if ln.startswith(phase)), None)
        assert line is not None and line.endswith(" s)"), (phase, lines)


MODEL_FILES = [
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_direct_route_writes_what_the_transformers_route_writes(tmp_path, dtype):
    # Q4_K and Q6_K matrices, F32 norms and biases: the storage of Qwen2.5's Q4_K_M GGUF, byte for byte
    source = tmp_path / "tiny-q4_k_m.gguf"
    values = write_kquant_qwen2(gguf, source)
    outs = {}
    for via in ("gguf", "transformers"):
        outs[via] = tmp_path / via
        assert main(["from-gguf", "--gguf", str(source), "--out", str(outs[via]), "--dtype", dtype, "--via", via]) == 0
    assert sorted(p.name for p in outs["gguf"].iterdir()) == MODEL_FILES
    assert sorted(p.name for p in outs["transformers"].iterdir()) == MODEL_FILES
    for name in MODEL_FILES:
        assert (outs["gguf"] / name).read_bytes() == (outs["transformers"] / name).read_bytes(), name
    saved = transformers.AutoModelForCausalLM.from_pretrained(outs["gguf"], dtype=getattr(torch, dtype)).state_dict()
    target = getattr(torch, dtype)
    assert torch.equal(
        saved["model.layers.1.mlp.down_proj.weight"], torch.from_numpy(values["blk.1.ffn_down.weight"]).to(target)
    )


def test_a_tied_lm_head_is_not_written(tmp_path):
    source = tmp_path / "tied.gguf"
    values = write_kquant_qwen2(gguf, source, skip=("output.weight",))
    out = tmp_path / "model"
    assert main(["from-gguf", "--gguf", str(source), "--out", str(out), "--via", "gguf"]) == 0
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    assert model.config.tie_word_embeddings is True
    embedding = torch.from_numpy(values["token_embd.weight"]).to(torch.bfloat16)
    assert torch.equal(model.state_dict()["lm_head.weight"], embedding)


def test_tensors_the_direct_route_does_not_know_are_refused(tmp_path, capsys):
    source = tmp_path / "odd.gguf"
    write_kquant_qwen2(gguf, source, extra=("rope_freqs.weight",))
    err = run_error(capsys, "--gguf", str(source), "--out", str(tmp_path / "m"), "--via", "gguf")
    assert "the tensors do not fit qwen2: missing [], unexpected ['rope_freqs.weight']" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["odd.gguf"]


def test_a_tokenizer_transformers_cannot_read_fails_the_direct_route_cleanly(tmp_path, capsys):
    # read beside the weights, in a process of its own: its error must still come back as the answer
    source = tmp_path / "bad.gguf"
    write_kquant_qwen2(gguf, source, tokenizer=False)
    err = run_error(capsys, "--gguf", str(source), "--out", str(tmp_path / "m"), "--via", "gguf")
    assert "bad.gguf: transformers" in err and "cannot read it: tokens and scores need to be passed" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf"]


def test_via_gguf_names_the_architectures_it_knows(tmp_path, capsys):
    source = tmp_path / "tiny-llama.gguf"
    write_gguf(source, "llama")  # llama's q/k are permuted in GGUF: only transformers' route undoes that
    err = run_error(capsys, "--gguf", str(source), "--out", str(tmp_path / "m"), "--via", "gguf")
    assert "--via gguf knows the tensors of qwen2, not llama; pass --via transformers" in err


def run_error(capsys, *args: str) -> str:
    capsys.readouterr()
    assert main(["from-gguf", *args]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("calcx model: error: "), captured.err
    return captured.err


def test_missing_file(tmp_path, capsys):
    err = run_error(capsys, "--gguf", str(tmp_path / "nope.gguf"), "--out", str(tmp_path / "m"))
    assert "nope.gguf: no such file" in err


def test_not_a_gguf(tmp_path, capsys):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 a zip, not a gguf")
    err = run_error(capsys, "--gguf", str(fake), "--out", str(tmp_path / "m"))
    assert "model.gguf: not a GGUF file" in err
    assert not (tmp_path / "m").exists()


def test_a_truncated_gguf(tmp_path, capsys):
    source = tmp_path / "tiny.gguf"
    write_gguf(source, "qwen2")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(source.read_bytes()[:200])
    err = run_error(capsys, "--gguf", str(cut), "--out", str(tmp_path / "m"))
    assert "cut.gguf: cannot be read as GGUF" in err and "damaged or truncated" in err


def test_sha256_mismatch_writes_nothing(tmp_path, capsys):
    source = tmp_path / "tiny.gguf"
    write_gguf(source, "qwen2")
    err = run_error(capsys, "--gguf", str(source), "--out", str(tmp_path / "m"), "--sha256", "0" * 64)
    actual = hashlib.sha256(source.read_bytes()).hexdigest()
    assert f"sha256 is {actual}, expected {'0' * 64}" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.gguf"]


def test_sha256_that_is_not_hex(tmp_path, capsys):
    source = tmp_path / "tiny.gguf"
    source.write_bytes(b"GGUF")
    err = run_error(capsys, "--gguf", str(source), "--out", str(tmp_path / "m"), "--sha256", "abc")
    assert "is not a sha256 (64 hex digits)" in err


def test_non_empty_out_needs_force(tmp_path, capsys):
    source = tmp_path / "tiny.gguf"
    write_gguf(source, "qwen2")
    out = tmp_path / "model"
    out.mkdir()
    (out / "old.safetensors").write_bytes(b"old")
    err = run_error(capsys, "--gguf", str(source), "--out", str(out))
    assert "model: exists and is not empty" in err and "--force" in err
    assert main(["from-gguf", "--gguf", str(source), "--out", str(out), "--force"]) == 0
    assert not (out / "old.safetensors").exists() and (out / "config.json").is_file()


def test_gguf_without_chat_template_needs_one(tmp_path, capsys):
    source = tmp_path / "tiny.gguf"
    write_gguf(source, "qwen2", chat_template=None)
    err = run_error(capsys, "--gguf", str(source), "--out", str(tmp_path / "m"))
    assert "has no tokenizer.chat_template; pass --chat-template FILE" in err
    template = tmp_path / "chat.jinja"
    template.write_text("{{ messages[0]['content'] }}")
    assert (
        main(["from-gguf", "--gguf", str(source), "--out", str(tmp_path / "m"), "--chat-template", str(template)]) == 0
    )
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "m").chat_template == template.read_text()


def test_a_build_without_gguf_says_so(tmp_path, capsys, monkeypatch):
    source = tmp_path / "tiny.gguf"
    source.write_bytes(b"GGUF")
    monkeypatch.setitem(sys.modules, "gguf", None)  # what `import gguf` meets where it is not installed
    err = run_error(capsys, "--gguf", str(source), "--out", str(tmp_path / "m"))
    assert "this build lacks gguf" in err and "use the trainer artifact" in err
