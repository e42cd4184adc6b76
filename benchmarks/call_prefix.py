"""Could a rollout's model calls be trained as one token sequence instead of one sample a call?

The trainer makes each recorded model call its own sample, with the whole conversation so far as
its prompt, so a rollout of several calls trains its early turns again in every later prompt.
One sequence a rollout (the first prompt, then each answer and the tokens between answers) is
possible only where each call's prompt tokens begin with the previous call's prompt and generated
tokens. This reads a calcx store (the server's SQLite file, or the slim copy a GPU run brings back)
and prints, by partition (train/val): rollouts, consecutive call pairs and how many of them are
such prefixes, and the tokens a rollout trains as samples a call against the tokens of its last
call's prompt and answer (what one sequence holds when every call continues the one before: the
bound of what joining saves; calcx.trainer.rollouts.call_join joins only calls that do).

    python benchmarks/call_prefix.py STORE.db [--json]
    python benchmarks/call_prefix.py STORE.db --render MODEL_DIR   # also: rendered as the gateway sends them

Token ids are read from each call's recorded answer (vLLM's `prompt_token_ids` and the choice's
`token_ids`); calls without them, or not answered 200, are counted and left out, and so are
rollouts that did not succeed (still running, or failed: the trainer leaves them out too).

--render renders every recorded request again with MODEL_DIR's tokenizer and chat template (as vLLM
does: tool-call arguments as objects), first as recorded (how many give the recorded prompt tokens:
the check that the rendering is vLLM's), then with the earlier turns as the gateway now sends them
(calcx.server.assistant_turns), and counts the consecutive calls whose prompt then continues the
previous prompt and generated tokens. Meant for stores recorded before that rewrite: in a later one
the recorded prompts already are the rewritten ones, and the table's own prefix column counts them.
Needs transformers (the `trainer` resolve).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sqlite3
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src" / "python"))

from calcx.common.tokens import continues  # noqa: E402
from calcx.contract.labels import PARTITION_LABEL  # noqa: E402


def _tokens(response: bytes | str | None) -> tuple[list[int], list[int]] | None:
    if response is None:
        return None
    try:
        body = json.loads(response)
        prompt, generated = body["prompt_token_ids"], body["choices"][0]["token_ids"]
    except (ValueError, TypeError, KeyError, IndexError):
        return None
    if not isinstance(prompt, list) or not isinstance(generated, list):
        return None
    return prompt, generated


class Call(NamedTuple):
    request: dict[str, Any]
    prompt: list[int]
    generated: list[int]


def _trained_calls(db_path: str) -> tuple[dict[str, str], dict[str, list[Call]], int]:
    """(partition of each finished rollout, its latest attempt's calls with token ids in order, the
    number of that attempt's calls left out: not answered 200, or without token ids)."""
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    # only finished rollouts, and of each only its latest attempt, are trained
    finished = "FROM rollouts WHERE state = 'SUCCEEDED'"
    partitions = {
        rid: (json.loads(spec).get("labels") or {}).get(PARTITION_LABEL, "?")
        for rid, spec in con.execute(f"SELECT rollout_id, spec {finished}")
    }
    latest = dict(con.execute(f"SELECT rollout_id, latest_attempt {finished}"))
    calls: dict[str, list[Call]] = defaultdict(list)
    left_out = 0
    for rid, attempt, request, response, status in con.execute(
        "SELECT rollout_id, attempt_no, request, response, status_code FROM calls"
        " ORDER BY rollout_id, attempt_no, seq"
    ):
        if rid not in latest or attempt != latest[rid]:
            continue
        tokens = _tokens(response) if status == 200 else None
        if tokens is None:
            left_out += 1
            continue
        calls[rid].append(Call(json.loads(request), *tokens))
    con.close()
    return partitions, calls, left_out


def rendered(db_path: str, model_dir: str) -> dict[str, int]:
    """Every finished rollout's requests rendered again (see --render)."""
    from calcx.server.assistant_turns import as_generated

    # by name: this script's resolve (the server's) has neither transformers nor the trainer's modules;
    # --render needs a Python with both (the trainer's); the messages go to the template as vLLM hands them
    tokenizer = importlib.import_module("transformers").AutoTokenizer.from_pretrained(model_dir)
    as_rendered = importlib.import_module("calcx.trainer.warmup.dataset").as_rendered

    def render(request: dict[str, Any], rewrite: bool) -> list[int]:
        messages = as_generated(request["messages"]) if rewrite else request["messages"]
        ids = tokenizer.apply_chat_template(
            as_rendered(messages), tools=request.get("tools"), add_generation_prompt=True, tokenize=True
        )
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    out = {"calls": 0, "rendered_as_recorded": 0, "call_pairs": 0, "prefix_pairs_as_sent_now": 0}
    for calls in _trained_calls(db_path)[1].values():
        now = [render(call.request, rewrite=True) for call in calls]
        for call in calls:
            out["calls"] += 1
            out["rendered_as_recorded"] += render(call.request, rewrite=False) == call.prompt
        for k in range(1, len(calls)):
            out["call_pairs"] += 1
            out["prefix_pairs_as_sent_now"] += continues(now[k], now[k - 1], calls[k - 1].generated)
    return out


def measure(db_path: str) -> dict[str, Any]:
    partitions, calls, left_out = _trained_calls(db_path)
    out: dict[str, Any] = {"calls_left_out": left_out, "partitions": {}}
    for partition in sorted(set(partitions[rid] for rid in calls)):
        rollouts = [calls[rid] for rid in calls if partitions[rid] == partition]
        pairs = prefixes = per_call = one_sequence = 0
        for seq in rollouts:
            per_call += sum(len(c.prompt) + len(c.generated) for c in seq)
            one_sequence += len(seq[-1].prompt) + len(seq[-1].generated)  # the last prompt holds every earlier turn
            for before, after in zip(seq, seq[1:]):
                pairs += 1
                prefixes += continues(after.prompt, before.prompt, before.generated)
        n = len(rollouts)
        out["partitions"][partition] = {
            "rollouts": n,
            "calls_per_rollout": round(sum(len(s) for s in rollouts) / n, 2),
            "call_pairs": pairs,
            "prefix_pairs": prefixes,
            "tokens_per_rollout_as_call_samples": round(per_call / n),
            "tokens_per_rollout_as_one_sequence": round(one_sequence / n),
            "ratio": round(per_call / one_sequence, 2) if one_sequence else None,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Could a rollout's model calls be trained as one token sequence?")
    parser.add_argument("store")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--render", metavar="MODEL_DIR", help="render the requests again with this tokenizer")
    args = parser.parse_args(argv)
    report = measure(args.store)
    if args.render:
        report["rendered"] = rendered(args.store, args.render)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        "| partition | rollouts | model calls a rollout | consecutive calls | of them prefixes |"
        " tokens a rollout, a sample a call | as one sequence (all calls joined) | ratio |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, p in report["partitions"].items():
        print(
            f"| {name} | {p['rollouts']} | {p['calls_per_rollout']} | {p['call_pairs']} | {p['prefix_pairs']} |"
            f" {p['tokens_per_rollout_as_call_samples']} | {p['tokens_per_rollout_as_one_sequence']} | {p['ratio']} |"
        )
    print(f"calls left out (no token ids, or not answered 200): {report['calls_left_out']}")
    if "rendered" in report:
        r = report["rendered"]
        print(
            f"rendered again: {r['rendered_as_recorded']} of {r['calls']} calls give the recorded prompt tokens; "
            f"with earlier turns as the gateway sends them now, {r['prefix_pairs_as_sent_now']} of "
            f"{r['call_pairs']} consecutive calls continue the previous prompt and answer"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
