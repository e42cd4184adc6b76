"""``calcx model``: make the model directory the trainer loads from a GGUF file, without a hub.

Errors a user can fix (a missing or damaged file, a non-empty --out, a build without torch)
exit 2 with one line saying what was wrong and what to do, before any long step starts.
"""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from calcx.model.gguf import DTYPES, VIAS

    parser = argparse.ArgumentParser(prog="calcx model", description="Models without a hub.")
    sub = parser.add_subparsers(dest="command", required=True)
    conv = sub.add_parser(
        "from-gguf",
        help="convert a GGUF file into a Hugging Face model directory (safetensors)",
        description="Dequantize a GGUF file and save it as a safetensors model directory "
        "with its tokenizer and the GGUF's own chat template (architectures transformers reads "
        "from GGUF, e.g. qwen2, llama).",
    )
    conv.add_argument("--gguf", required=True, help="the .gguf file")
    conv.add_argument("--out", required=True, help="model directory to write (must be missing or empty)")
    conv.add_argument("--dtype", choices=DTYPES, default="bfloat16", help="weight dtype on disk (default bfloat16)")
    conv.add_argument("--sha256", default=None, help="expected sha256 of the GGUF file; refuse if it differs")
    conv.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE",
        help="Jinja chat template to use instead of the GGUF's tokenizer.chat_template",
    )
    conv.add_argument(
        "--via",
        choices=VIAS,
        default="auto",
        help="gguf: weights straight from the file's tensors (fast; qwen2); transformers: through a "
        "transformers model (any architecture it reads); auto (default): gguf where it applies",
    )
    conv.add_argument("--force", action="store_true", help="replace a non-empty --out")
    return parser


def main(argv: list[str] | None = None) -> int:
    from calcx.model.gguf import ConvertError, convert

    args = build_parser().parse_args(argv)
    try:
        result = convert(
            args.gguf,
            args.out,
            dtype=args.dtype,
            sha256=args.sha256,
            force=args.force,
            chat_template_file=args.chat_template,
            via=args.via,
            log=lambda line: print(line, flush=True),
        )
    except ConvertError as exc:
        print(f"calcx model: error: {exc}", file=sys.stderr)
        return 2
    print(
        f"wrote {result.out}: {result.architecture}, {result.parameters:,} parameters, "
        f"{result.bytes_written / 1e6:.1f} MB; train with --model {result.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
