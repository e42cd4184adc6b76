"""A tokenizer for trainer tests that needs no model download: every byte a token, plus the
ChatML specials (skipped in decoding, as a Qwen tokenizer's), with calcx's Hermes chat template."""

from __future__ import annotations

from typing import Any

from calcx.trainer.config.compose import NAMED_TEMPLATES


def byte_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = NAMED_TEMPLATES["hermes"].read_text(encoding="utf-8")
    return tokenizer
