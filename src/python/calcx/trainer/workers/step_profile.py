"""`calcx profile-step`: what one GRPO update and one old-log-prob pass cost on this GPU, and why.

A step's GPU work is verl's actor update (forward + backward over every recorded token) and the
old-log-prob pass (forward only). This command times both for the model's architecture on a
batch shaped like a Calc-X step (packed rows of agent calls), under settings that differ one lever
at a time: attention over packed rows (SDPA with a block mask or `calcx_varlen`), activation
recomputation, the token budget of a micro-batch, and full-vocabulary logits against chunked
log-probs (verl's fused linear-for-PPO). It runs verl's own log-prob functions on the model
transformers builds, without FSDP or an optimizer: the kernel mix of a step, not its bookkeeping.
It also profiles one micro-batch of each setting (top kernels by GPU time), checks that both
attention paths give the same log-probs, and prints a table with the share of the GPU's bf16 peak
each setting reaches. Random weights: speed does not depend on them, so no model download is
needed (`--model DIR` takes the architecture from a model directory instead of Qwen2.5-1.5B's).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Qwen2.5-1.5B-Instruct's architecture (the reference model); --model reads another one
QWEN25_15B = dict(
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1e6,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
# verl's figure for an H100/H200's dense bf16 peak (verl.utils.flops_counter), so that the MFU here
# reads like verl's `perf/mfu/actor`
PEAK_FLOPS = 989e12


@dataclass
class Setting:
    name: str
    attention: str  # "sdpa" | "calcx_varlen"
    recompute: bool
    update_budget: int  # tokens a micro-batch of the update holds
    logprob_budget: int  # tokens a micro-batch of the log-prob pass holds
    fused_logprobs: bool


# one lever at a time, from calcx's earlier defaults to its defaults for a large GPU
SETTINGS = [
    Setting("before: sdpa, recompute, 8k, full logits", "sdpa", True, 8192, 8192, False),
    Setting("+ varlen attention", "calcx_varlen", True, 8192, 8192, False),
    Setting("+ chunked log-probs", "calcx_varlen", True, 8192, 8192, True),
    Setting("+ no recompute", "calcx_varlen", False, 8192, 32768, True),
    Setting("+ 16k update, 64k log-prob", "calcx_varlen", False, 16384, 65536, True),
    Setting("+ 32k update", "calcx_varlen", False, 32768, 65536, True),
]


@dataclass
class Result:
    setting: str
    update_s: float | None = None
    logprob_s: float | None = None
    update_microbatches: int = 0
    logprob_microbatches: int = 0
    peak_update_gib: float | None = None
    peak_logprob_gib: float | None = None
    update_mfu: float | None = None
    logprob_mfu: float | None = None
    error: str | None = None
    top_kernels: list[dict[str, Any]] = field(default_factory=list)


def row_lengths(rows: int, mean: int, seed: int) -> list[int]:
    """Row lengths of a Calc-X step (prompt + response of one agent call): uniform over
    [0.4, 1.6] x mean, so the total is about rows x mean."""
    rng = random.Random(seed)
    return [rng.randint(int(mean * 0.4), int(mean * 1.6)) for _ in range(rows)]


def micro_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Rows cut into micro-batches of at most `budget` tokens (longest first, first fit), as
    verl's token-budgeted micro-batches are."""
    bins: list[tuple[int, list[int]]] = []
    for n in sorted(lengths, reverse=True):
        if n > budget:
            raise ValueError(f"a row of {n} tokens does not fit a {budget}-token micro-batch")
        for i, (used, rows) in enumerate(bins):
            if used + n <= budget:
                bins[i] = (used + n, rows + [n])
                break
        else:
            bins.append((n, [n]))
    return [rows for _, rows in bins]


def update_flops(n_params: int, config: Any, lengths: list[int]) -> float:
    """verl's FLOPs of a forward + backward (6 N T plus attention), so MFU matches its metric."""
    head_dim = config.hidden_size // config.num_attention_heads
    attn = 6 * sum(n * n for n in lengths) * head_dim * config.num_attention_heads * config.num_hidden_layers
    return 6.0 * n_params * sum(lengths) + attn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="calcx profile-step", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a model directory to take the architecture from (default: Qwen2.5-1.5B's)")
    parser.add_argument("--rows", type=int, default=256, help="rows in a step (agent calls; default 256)")
    parser.add_argument("--mean-tokens", type=int, default=290, help="mean tokens a row (default 290)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", help="comma-separated setting numbers (1-based) to run; default all")
    parser.add_argument("--out", type=Path, help="write profile.json and profile.md here")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("calcx profile-step: no CUDA GPU was found on this machine", file=sys.stderr)
        return 3
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config

    import calcx.trainer.workers.packed_attention  # noqa: F401  (registers calcx_varlen)

    config = AutoConfig.from_pretrained(args.model) if args.model else Qwen2Config(**QWEN25_15B)
    lengths = row_lengths(args.rows, args.mean_tokens, args.seed)
    chosen = SETTINGS if not args.only else [SETTINGS[int(i) - 1] for i in args.only.split(",")]
    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    print(
        f"profile-step: {props.name}, {props.total_memory / 2**30:.0f} GiB, torch {torch.__version__}; "
        f"{len(lengths)} rows, {sum(lengths)} tokens",
        flush=True,
    )

    t0 = time.perf_counter()
    config._attn_implementation = "sdpa"
    with device:
        model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e9:.2f}e9 parameters, built in {time.perf_counter() - t0:.1f} s", flush=True)

    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    ids = torch.randint(0, config.vocab_size, (sum(lengths),), generator=gen)
    results = [run_setting(model, config, s, lengths, ids, n_params) for s in chosen]
    agreement = logprob_agreement(model, lengths, ids)

    table = render(results, props.name, lengths, agreement)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "profile.md").write_text(table, encoding="utf-8")
        (args.out / "profile.json").write_text(
            json.dumps(
                {
                    "gpu": props.name,
                    "torch": torch.__version__,
                    "rows": len(lengths),
                    "tokens": sum(lengths),
                    "params": n_params,
                    "agreement": agreement,
                    "results": [asdict(r) for r in results],
                },
                indent=1,
            ),
            encoding="utf-8",
        )
    return 0


def _rows_input(lengths: list[int], ids: Any, offset: int) -> tuple[Any, Any, Any]:
    """(input ids, position ids, next-token labels) of rows packed end to end, on the GPU."""
    import torch

    total = sum(lengths)
    chunk = ids[offset : offset + total].cuda()
    positions = torch.cat([torch.arange(n) for n in lengths]).cuda()
    return chunk.unsqueeze(0), positions.unsqueeze(0), torch.roll(chunk, -1)


def _logprobs(
    model: Any, setting: Setting, input_ids: Any, position_ids: Any, labels: Any, entropy: bool
) -> tuple[Any, Any]:
    """Per-token log-probs (and entropy) as verl computes them for packed rows."""
    if setting.fused_logprobs:
        from verl.utils.experimental.torch_functional import FusedLinearForPPO

        hidden = model.model(input_ids=input_ids, position_ids=position_ids, use_cache=False).last_hidden_state
        logp, ent = FusedLinearForPPO(impl_backend="torch")(hidden.squeeze(0), model.lm_head.weight, labels)
        return logp, (ent if entropy else None)
    from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

    logits = model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits.squeeze(0)
    logp = logprobs_from_logits(logits, labels)
    return logp, (entropy_from_logits(logits) if entropy else None)


def _configure(model: Any, setting: Setting) -> None:
    model.config._attn_implementation = setting.attention
    for module in model.modules():
        if hasattr(module, "config") and hasattr(module.config, "_attn_implementation"):
            module.config._attn_implementation = setting.attention
    if setting.recompute:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()


def _update_pass(model: Any, setting: Setting, batches: list[list[int]], ids: Any) -> None:
    offset = 0
    for rows in batches:
        input_ids, position_ids, labels = _rows_input(rows, ids, offset)
        offset += sum(rows)
        logp, _ = _logprobs(model, setting, input_ids, position_ids, labels, entropy=False)
        # the PPO surrogate's cost is elementwise; what matters is the backward through the model
        (-(logp * 0.01).mean()).backward()
    model.zero_grad(set_to_none=True)


def _logprob_pass(model: Any, setting: Setting, batches: list[list[int]], ids: Any) -> None:
    import torch

    offset = 0
    with torch.no_grad():
        for rows in batches:
            input_ids, position_ids, labels = _rows_input(rows, ids, offset)
            offset += sum(rows)
            _logprobs(model, setting, input_ids, position_ids, labels, entropy=True)


def _timed(fn: Any) -> float:
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def run_setting(model: Any, config: Any, setting: Setting, lengths: list[int], ids: Any, n_params: int) -> Result:
    import torch

    result = Result(setting=setting.name)
    weights = torch.cuda.memory_allocated()
    try:
        _configure(model, setting)
        model.train()
        update = micro_batches(lengths, setting.update_budget)
        logprob = micro_batches(lengths, setting.logprob_budget)
        result.update_microbatches, result.logprob_microbatches = len(update), len(logprob)
        _update_pass(model, setting, update[:1], ids)  # warm-up: kernels chosen, allocator grown
        torch.cuda.reset_peak_memory_stats()
        result.update_s = _timed(lambda: _update_pass(model, setting, update, ids))
        result.peak_update_gib = (torch.cuda.max_memory_allocated() - weights) / 2**30
        result.update_mfu = update_flops(n_params, config, lengths) / result.update_s / PEAK_FLOPS
        model.eval()
        torch.cuda.reset_peak_memory_stats()
        result.logprob_s = _timed(lambda: _logprob_pass(model, setting, logprob, ids))
        result.peak_logprob_gib = (torch.cuda.max_memory_allocated() - weights) / 2**30
        result.logprob_mfu = update_flops(n_params, config, lengths) / 3 / result.logprob_s / PEAK_FLOPS
        model.train()
        result.top_kernels = top_kernels(lambda: _update_pass(model, setting, update[:1], ids))
    except torch.cuda.OutOfMemoryError as exc:
        result.error = f"out of memory: {str(exc).splitlines()[0][:160]}"
    except Exception as exc:  # a setting that cannot run on this machine is reported, not fatal
        result.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    finally:
        model.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
    print(
        f"  {setting.name}: update {_fmt(result.update_s)} s, log-prob {_fmt(result.logprob_s)} s, "
        f"peak {_fmt(result.peak_update_gib)} GiB" + (f", {result.error}" if result.error else ""),
        flush=True,
    )
    return result


def top_kernels(fn: Any, limit: int = 10) -> list[dict[str, Any]]:
    """The GPU kernels of one call of `fn` that took the most GPU time, with their share."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        _timed(fn)
    rows: list[tuple[float, str, int]] = []
    for event in prof.key_averages():
        # the kernels themselves; an aten op's device time is its kernels' again
        if getattr(event, "device_type", None) != DeviceType.CUDA:
            continue
        us = getattr(event, "self_device_time_total", None)
        if us is None:
            us = getattr(event, "self_cuda_time_total", 0)
        if us and us > 0:
            rows.append((float(us), str(event.key), int(event.count)))
    total = sum(us for us, _, _ in rows) or 1.0
    rows.sort(reverse=True)
    return [
        {"kernel": key[:90], "ms": round(us / 1000, 2), "share": round(us / total, 3), "calls": count}
        for us, key, count in rows[:limit]
    ]


def logprob_agreement(model: Any, lengths: list[int], ids: Any) -> dict[str, Any]:
    """Log-probs of the same rows through the SDPA block mask and through calcx_varlen (one
    micro-batch): the two attention paths must agree to bf16 precision."""
    import torch

    rows = micro_batches(lengths, 8192)[0]
    input_ids, position_ids, labels = _rows_input(rows, ids, 0)
    model.eval()
    out = {}
    try:
        with torch.no_grad():
            for attention in ("sdpa", "calcx_varlen"):
                setting = Setting(attention, attention, False, 8192, 8192, True)
                _configure(model, setting)
                position = position_ids.clone()  # no row bounds cached from the other path
                out[attention], _ = _logprobs(model, setting, input_ids, position, labels, entropy=False)
        diff = (out["sdpa"] - out["calcx_varlen"]).abs()
        return {"tokens": int(diff.numel()), "max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean())}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render(results: list[Result], gpu: str, lengths: list[int], agreement: dict[str, Any]) -> str:
    lines = [
        f"# One Calc-X step's GPU work on {gpu}",
        "",
        f"{len(lengths)} packed rows, {sum(lengths)} tokens; bf16 weights, no FSDP or optimizer; "
        "MFU against 989 TFLOP/s (verl's H100/H200 figure).",
        "",
        "| setting | update s | micro-batches | update MFU | peak GiB (beyond weights) | log-prob s | "
        "log-prob micro-batches | log-prob peak GiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if r.error:
            lines.append(f"| {r.setting} | {r.error} | | | | | | |")
            continue
        lines.append(
            f"| {r.setting} | {_fmt(r.update_s)} | {r.update_microbatches} | "
            f"{_fmt(100 * (r.update_mfu or 0), 1)}% | {_fmt(r.peak_update_gib, 1)} | {_fmt(r.logprob_s)} | "
            f"{r.logprob_microbatches} | {_fmt(r.peak_logprob_gib, 1)} |"
        )
    lines += ["", f"Log-probs of one micro-batch, SDPA block mask against calcx_varlen: {json.dumps(agreement)}", ""]
    for r in results:
        if r.top_kernels:
            lines += [
                f"## Top kernels of one update micro-batch: {r.setting}",
                "",
                "| kernel | ms | share | calls |",
                "|---|---:|---:|---:|",
            ]
            lines += [
                f"| `{k['kernel']}` | {k['ms']} | {100 * k['share']:.1f}% | {k['calls']} |" for k in r.top_kernels
            ]
            lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
