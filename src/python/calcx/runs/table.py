"""`calcx runs table`: the step tables of a verl run's metrics file (verl's `file` logger JSONL), for
docs/gpu-run.md and the run records' steps.md.

    calcx runs table METRICS.jsonl [--calls calcx.db [--incomplete F] [--sessions F] [--outcomes CSV] [--versus OTHER.db]] [--starts F]

With `--calls` (the calcx server's SQLite store, or its slim copy), the GPU's idle share of each step
while it waited for agents is measured from the recorded model calls: the generation phase minus the
union of the intervals in which at least one call was inside vLLM, over the whole step; and the
store's agent table follows the step table: per step, the training rollouts, the share with a
successful calculator call, the mean share of the row's reference steps (its GSM8K annotations'
results) those calls returned, tool calls per rollout, tool-call parse failures (a `<tool_call>` in the
text that vLLM's parser did not turn into a call; all four counted by `calcx.trainer.rollouts.tool_use`, as
the trainer's `calcx/train/...` metrics are), failed attempts (retried as new ones) and the largest
policy-version lag of a call: how many weight syncs behind the weights its rollout's step starts from
(step - 1) the version that answered it was (the server records the version it serves at the time of
each call). With `--incomplete` too, what the calls of the rollouts left out of their steps came back
with. And the validation per problem: each validation's accuracy with its standard error, and which
problems a validation got right that the one before it got wrong and the other way, with the change's
paired standard error (the same problems both times); with `--versus OTHER.db`, the same against
another run's store at each step both validated (two recipes on the same validation set).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from calcx.runs import agents, steps, validation
from calcx.runs.versus import versus_table
from calcx.server.store.reader import StoreReader

DESCRIPTION = __doc__.split("\n\n")[0]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("metrics", type=Path)
    parser.add_argument("--calls", type=Path, help="the calcx server's SQLite store of the run")
    parser.add_argument(
        "--incomplete",
        type=Path,
        help="the run's incomplete_groups.jsonl: with --calls, what their calls came back with",
    )
    parser.add_argument(
        "--sessions",
        type=Path,
        help="the run's session_times.jsonl: with --calls, the trainer's sessions in the wait table",
    )
    parser.add_argument(
        "--starts",
        type=Path,
        help="the run's starts.jsonl: a restart's first step pays start-up, left out of the wait summary",
    )
    parser.add_argument(
        "--outcomes",
        type=Path,
        metavar="CSV",
        help="with --calls, write each validation problem's reward per step (step,id,source,reward): "
        "what a run record keeps of its store, for pairing runs without it",
    )
    parser.add_argument(
        "--versus",
        type=Path,
        metavar="OTHER_DB",
        help="with --calls, another run's store: the two runs' validations per problem, step by step",
    )


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse (exit 2) what needs the run's store without it, and a store that is not there."""
    if args.versus and not args.calls:
        parser.error("--versus compares this run's store (--calls) with another's: give --calls too")
    if args.outcomes and not args.calls:
        parser.error("--outcomes reads the run's store (--calls): give --calls too")
    for store in (args.calls, args.versus):
        if store is not None and not store.is_file():
            parser.error(f"{store}: no such store file")


def _validation_tables(args: argparse.Namespace, store: StoreReader) -> None:
    """The validation per problem: all of it and, with several sources, each apart; against --versus."""
    outcomes = validation.validation_outcomes(store)
    sources = validation.validation_sources(store)
    if args.outcomes:
        args.outcomes.write_text(validation.outcomes_csv(outcomes, sources))
    by_source = validation.split_by_source(outcomes, sources)
    # several sources (e.g. gsm8k and its hard split): all of them, then each apart
    parts = [("", outcomes)] + (
        [(f" ({name})", part) for name, part in by_source.items()] if len(by_source) > 1 else []
    )
    for label, part in parts:
        if part:
            print(f"\nvalidation per problem{label} (the store's validation rollouts; SE: standard error):\n")
            print(validation.validation_table(part))
    if args.versus:
        with StoreReader(args.versus) as other_store:
            other = validation.validation_outcomes(other_store)
            other_sources = validation.validation_sources(other_store)
        other_parts = {
            "": other,
            **{f" ({name})": part for name, part in validation.split_by_source(other, other_sources).items()},
        }
        for label, part in parts:
            print(f"\nthis run against {args.versus}{label}, the same problems at each step both validated:\n")
            print(versus_table(part, other_parts.get(label, {})))


def _store_tables(args: argparse.Namespace, metrics: steps.Metrics, store: StoreReader) -> None:
    """What the run's store adds: the agents, the GPU's wait, the evicted rollouts' calls, validation."""
    print()
    print(agents.agent_table(agents.agent_stats(store)))
    print()
    print(agents.wait_table(metrics, agents.wait_breakdown(store, args.sessions)))
    if args.incomplete and args.incomplete.is_file():
        print()
        print(agents.evicted_calls(store, args.incomplete))
    _validation_tables(args, store)


def print_tables(args: argparse.Namespace) -> int:
    """Every table and summary, in the order steps.md holds them."""
    metrics = steps.read_metrics(args.metrics)
    store = StoreReader(args.calls) if args.calls else None
    try:
        busy = agents.busy_seconds_by_step(store) if store is not None else None
        print(steps.step_table(metrics, busy))
        tool_use = steps.tool_use_table(metrics)
        if tool_use:
            print()
            print(tool_use)
        if store is not None:
            _store_tables(args, metrics, store)
    finally:
        if store is not None:
            store.close()
    line = steps.validation_line(metrics)
    if line:
        print("\n" + line)
    restarts = steps.restarted_steps(args.starts)
    timed = steps.timed_steps(metrics)
    summary = steps.idle_summary(timed, busy, restarts) if busy is not None else None
    if summary:
        print("\n" + summary)
    line = steps.step_time_line(timed, restarts)
    if line:
        print("\n" + line)
    return 0
