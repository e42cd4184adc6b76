"""`calcx ledger`: check a run's training ledger on the server's SQLite store (docs/resume.md).

The proof that a killed and resumed run trained each rollout at most once, and that every step it
kept trained a whole batch, is a handful of queries over the store's `trained`, `rollouts` and
`attempts` tables. They live here once: the command prints them and their answers, the resume
tests assert on the same figures. The database is opened read-only, so a live server is safe.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from calcx.contract.labels import RUN_LABEL

#: the JSON path of a rollout's run label in its stored spec
_RUN = f"$.labels.{RUN_LABEL}"

#: each rollout trained at most once into the run's surviving weights: no rows
TRAINED_TWICE = """
SELECT rollout_id, COUNT(*) FROM trained
WHERE run = :run AND rolled_back_at IS NULL GROUP BY rollout_id HAVING COUNT(*) > 1
"""
#: every surviving step: its rollouts, groups, and how many of the trained attempts SUCCEEDED in this run
STEP_BATCHES = f"""
SELECT t.step, COUNT(*), COUNT(DISTINCT json_extract(r.spec, '$.group_id')),
       SUM(a.state = 'SUCCEEDED' AND json_extract(r.spec, '{_RUN}') = t.run)
FROM trained t JOIN rollouts r ON r.rollout_id = t.rollout_id
JOIN attempts a ON a.rollout_id = t.rollout_id AND a.attempt_no = t.attempt_no
WHERE t.run = :run AND t.rolled_back_at IS NULL GROUP BY t.step ORDER BY t.step
"""
#: what was redone: the steps a resume rolled back, with their rollouts
ROLLED_BACK = """
SELECT step, COUNT(*) FROM trained
WHERE run = :run AND rolled_back_at IS NOT NULL GROUP BY step ORDER BY step
"""
#: nothing of the run left in flight
IN_FLIGHT = f"""
SELECT COUNT(*) FROM rollouts
WHERE state IN ('QUEUED', 'RUNNING') AND json_extract(spec, '{_RUN}') = :run
"""
#: the run's rollouts by final state and failure reason (cancelled ones are the dead run's leftovers)
OUTCOMES = f"""
SELECT r.state, COALESCE(a.reason, ''), COUNT(*)
FROM rollouts r LEFT JOIN attempts a ON a.rollout_id = r.rollout_id AND a.attempt_no = r.latest_attempt
WHERE json_extract(r.spec, '{_RUN}') = :run GROUP BY 1, 2 ORDER BY 1, 2
"""
#: problems (the rows' `id`) a rolled-back step drew that the re-run of the same step did not: the data
#: loader resumed somewhere other than the checkpoint's position, so these were skipped (no rows; a
#: rolled-back step not yet trained again is left out)
NOT_REDRAWN = """
SELECT b.step, COUNT(DISTINCT json_extract(rb.spec, '$.row.id'))
FROM trained b JOIN rollouts rb ON rb.rollout_id = b.rollout_id
WHERE b.run = :run AND b.rolled_back_at IS NOT NULL
  AND b.step IN (SELECT step FROM trained WHERE run = :run AND rolled_back_at IS NULL)
  AND json_extract(rb.spec, '$.row.id') NOT IN (
  SELECT json_extract(rk.spec, '$.row.id') FROM trained k JOIN rollouts rk ON rk.rollout_id = k.rollout_id
  WHERE k.run = :run AND k.rolled_back_at IS NULL AND k.step = b.step)
GROUP BY b.step ORDER BY b.step
"""
#: the surviving steps' problems: distinct ones, and (step, problem) pairs; equal when no problem was
#: trained at two steps (within one epoch; a longer run draws each problem once an epoch)
PROBLEMS = """
SELECT COUNT(DISTINCT json_extract(r.spec, '$.row.id')),
       COUNT(DISTINCT t.step || ' ' || json_extract(r.spec, '$.row.id'))
FROM trained t JOIN rollouts r ON r.rollout_id = t.rollout_id
WHERE t.run = :run AND t.rolled_back_at IS NULL
"""
QUERIES = {
    "trained_twice": TRAINED_TWICE,
    "step_batches": STEP_BATCHES,
    "rolled_back": ROLLED_BACK,
    "in_flight": IN_FLIGHT,
    "outcomes": OUTCOMES,
    "not_redrawn": NOT_REDRAWN,
    "problems": PROBLEMS,
}


@dataclass
class LedgerAudit:
    run: str
    trained_twice: list[tuple[str, int]]
    steps: list[tuple[int, int, int, int]]  # (step, rollouts, groups, succeeded)
    rolled_back: list[tuple[int, int]]  # (step, rollouts)
    in_flight: int
    outcomes: list[tuple[str, str, int]]  # (state, failure reason of the last attempt, rollouts)
    not_redrawn: list[tuple[int, int]] = field(default_factory=list)  # (rolled-back step, problems skipped)
    distinct_problems: int = 0  # over the surviving steps, by the rows' `id`
    step_problems: int = 0  # (step, problem) pairs: more than distinct_problems when a problem came back
    problems: list[str] = field(default_factory=list)

    def check(self, batch_rollouts: int | None = None) -> list[str]:
        """What is wrong with the ledger (nothing: an empty list)."""
        problems = [f"rollout {rid} trained {n} times" for rid, n in self.trained_twice]
        numbers = [step for step, *_ in self.steps]
        if numbers != list(range(1, len(numbers) + 1)):
            problems.append(f"the surviving steps are not 1..{len(numbers)}: {numbers}")
        for step, rollouts, _, succeeded in self.steps:
            if succeeded != rollouts:
                problems.append(
                    f"step {step}: {rollouts - succeeded} of {rollouts} trained rollouts not SUCCEEDED " "in this run"
                )
            if batch_rollouts is not None and rollouts != batch_rollouts:
                problems.append(f"step {step}: {rollouts} rollouts, not a whole batch of {batch_rollouts}")
        if self.in_flight:
            problems.append(f"{self.in_flight} rollout(s) of the run still QUEUED or RUNNING")
        problems += [
            f"step {step}: {n} problem(s) the rolled-back step drew were not drawn when it ran again "
            "(the data loader did not resume at the checkpoint's position)"
            for step, n in self.not_redrawn
        ]
        self.problems = problems
        return problems


def audit(db_path: Path, run: str) -> LedgerAudit:
    """Run the queries on the store at `db_path` (read-only) for the run labelled `run`."""
    if not db_path.is_file():
        raise FileNotFoundError(f"no server database at {db_path}")
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        rows = {name: db.execute(sql, {"run": run}).fetchall() for name, sql in QUERIES.items()}
    finally:
        db.close()
    return LedgerAudit(
        run=run,
        trained_twice=[tuple(r) for r in rows["trained_twice"]],
        steps=[tuple(r) for r in rows["step_batches"]],
        rolled_back=[tuple(r) for r in rows["rolled_back"]],
        in_flight=rows["in_flight"][0][0],
        outcomes=[tuple(r) for r in rows["outcomes"]],
        not_redrawn=[tuple(r) for r in rows["not_redrawn"]],
        distinct_problems=rows["problems"][0][0],
        step_problems=rows["problems"][0][1],
    )


def render(result: LedgerAudit) -> str:
    lines = [
        f"training ledger of run {result.run!r}",
        f"rollouts trained more than once: {len(result.trained_twice)}",
        f"rollouts of the run still queued or running: {result.in_flight}",
        "",
        "| step | rollouts trained | groups | SUCCEEDED attempts of this run |",
        "|---:|---:|---:|---:|",
    ]
    lines += [f"| {s} | {n} | {g} | {ok} |" for s, n, g, ok in result.steps]
    lines += [
        "",
        "steps rolled back by a resume (trained again after it): "
        + (", ".join(f"{s} ({n} rollouts)" for s, n in result.rolled_back) or "none"),
    ]
    lines += [
        "problems of rolled-back steps not drawn again when the step ran again: "
        + (", ".join(f"step {s} {n}" for s, n in result.not_redrawn) or "none")
    ]
    lines += [
        f"problems trained (rows' id): {result.distinct_problems} distinct over {result.step_problems} "
        f"(step, problem) pairs ({result.step_problems - result.distinct_problems} came back at a later step; "
        "0 within one epoch)"
    ]
    lines += [
        "rollouts of the run by state (last attempt's failure reason): "
        + ", ".join(f"{state}{f' {why}' if why else ''} {n}" for state, why, n in result.outcomes)
    ]
    lines += ["", "OK" if not result.problems else "PROBLEMS:", *[f"- {p}" for p in result.problems]]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="calcx ledger", description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, required=True, help="the server's SQLite file (runs/RUN/services/calcx.db)")
    parser.add_argument("--run", required=True, help="the run's name (every rollout's `run` label)")
    parser.add_argument(
        "--batch-rollouts",
        type=int,
        default=None,
        help="rollouts a whole step trains (train_batch_size x n); checked when given",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--show-queries", action="store_true", help="print the SQL the figures come from")
    args = parser.parse_args(argv)
    try:
        result = audit(args.db, args.run)
    except (FileNotFoundError, sqlite3.Error) as exc:
        print(f"calcx ledger: {exc}", file=sys.stderr)
        return 2
    result.check(args.batch_rollouts)
    if args.show_queries:
        print("\n".join(f"-- {name}{sql.rstrip()};" for name, sql in QUERIES.items()), end="\n\n")
    print(json.dumps(asdict(result), indent=1) if args.json else render(result))
    return 1 if result.problems else 0


if __name__ == "__main__":
    sys.exit(main())
