"""The rows of a fault run: which planned fault each row carries, what it must end as, and
which failures a process fault causes to whatever was running (collateral)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calcx.contract.failures import FailureReason
from calcx.faults.hostile import HOSTILE_QUESTION_SUFFIXES, UNCARRIABLE_QUESTION_SUFFIXES

#: kind -> (question suffix or stub/proxy marker, expected (state, reason or None), reward expected)
PLANNED: dict[str, tuple[str, tuple[str, str | None]]] = {
    "model-500": ("[stub:error500]", ("FAILED", FailureReason.MODEL_UNREACHABLE)),
    "model-timeout": ("[stub:hang=120]", ("FAILED", "*")),  # model_unreachable or timeout, depending on timing
    "model-garbage-body": ("[fault:garbage]", ("FAILED", FailureReason.MODEL_UNREACHABLE)),
    "model-bad-tool-json": ("[stub:badjson]", ("SUCCEEDED", None)),
    "reflection-tool-call": ("[fault:reflect-tool]", ("SUCCEEDED", None)),
    "answer-import": ("[fault:answer=import]", ("SUCCEEDED", None)),
    "answer-eval": ("[fault:answer=eval]", ("SUCCEEDED", None)),
    "answer-9**9**9": ("[fault:answer=power]", ("SUCCEEDED", None)),
    "answer-10MB": ("[fault:answer=huge]", ("SUCCEEDED", None)),
    # calculator bombs: the calculator refuses them at once (a tool error the model reads); the rollout finishes
    "calculator-bomb-9**9**8": ("", ("SUCCEEDED", None)),
    "calculator-bomb-string": ("", ("SUCCEEDED", None)),
    # the stub holds the first model call for 3 s: the calculator is killed while the agent waits
    "calculator-killed-mid-rollout": ("[stub:slow=3]", ("FAILED", FailureReason.CALCULATOR_FAILED)),
    "agent-killed-mid-rollout": ("[stub:slow=3]", ("FAILED", FailureReason.CRASH)),
}
PLANNED.update({f"question-{name}": ("", ("SUCCEEDED", None)) for name in HOSTILE_QUESTION_SUFFIXES})
# a question no runner could hand to an agent is refused when it is created, never queued
PLANNED.update({f"question-{name}": ("", ("REFUSED", "422")) for name in UNCARRIABLE_QUESTION_SUFFIXES})
REFUSED_AT_CREATE = frozenset(kind for kind, (_, (state, _)) in PLANNED.items() if state == "REFUSED")
#: kind -> the expression the stub hands the calculator: each would take gigabytes or hours unbounded.
BOMB_EXPRESSIONS = {"calculator-bomb-9**9**8": "9**9**8", "calculator-bomb-string": "'9'*10**8"}
#: (fraction of rollouts terminal, process fault)
DEFAULT_SCHEDULE = [
    (0.10, "second-controller-start"),
    (0.22, "server-sigterm"),
    (0.38, "controller-restart"),
    (0.55, "server-sigkill"),
    (0.70, "second-controller-stop"),
]
#: Attempts per row: one more than the process faults of the schedule, so a row has an attempt that
#: none of them cut short even if each one hits it (then its planned fault is seen, not masked).
MAX_ATTEMPTS = len(DEFAULT_SCHEDULE) + 1
RETRIABLE_KINDS = {"clean"} | {f"question-{n}" for n in HOSTILE_QUESTION_SUFFIXES}
#: Failures a process fault (controller killed or stopped) causes to whatever was running.
#: (Not cancelled_by_api: the cancel API withdraws work, and a trainer does not retry it.)
COLLATERAL_REASONS = {
    FailureReason.CONTROLLER_LOST,
    FailureReason.CANCELLED,
    FailureReason.REWARD_POST_FAILED,
}  # + a server restart under an agent


def outcome_name(state: str, reason: str | None) -> str:
    """How the audit names an outcome: SUCCEEDED, FAILED <reason>, REFUSED <status>."""
    return state if state == "SUCCEEDED" else f"{state} {reason}"


def should_retry(kind: str, rollout: Any) -> bool:
    """What the driver retries, as a trainer would: any infrastructure failure of a row that
    should succeed; a planned-fault row only when a process fault got in its way."""
    if rollout.state != "FAILED" or len(rollout.attempts) >= rollout.max_attempts:
        return False
    return kind in RETRIABLE_KINDS or rollout.attempts[-1].reason in COLLATERAL_REASONS


def decisive_attempt(rollout: Any) -> Any:
    """The first attempt that was not cut short by a process fault (else the last one)."""
    for a in rollout.attempts:
        if not (a.state == "FAILED" and a.reason in COLLATERAL_REASONS):
            return a
    return rollout.attempts[-1]


@dataclass
class Plan:
    specs: list[dict[str, Any]]
    kind: dict[str, str]  # rid -> kind
    questions: dict[str, str]  # rid -> exact question text
    script: Path


def build_plan(
    n: int,
    workdir: Path,
    seed: int = 7,
    prefix: str = "f",
    deadline_s: float = 45.0,
    kinds_each: int = 2,
    kinds: Iterable[str] | None = None,
) -> Plan:
    """N rollouts: each planned kind (all, or ``kinds``) ``kinds_each`` times, spread evenly,
    the rest clean rows."""
    from calcx.data.generator import generate_split
    from calcx.data.io import write_jsonl

    rows = generate_split("train", n, seed=seed)
    planned = [k for k in (PLANNED if kinds is None else kinds) for _ in range(kinds_each)]
    if len(planned) > n:
        raise SystemExit(f"--n {n} is too small for {len(planned)} planned faults")
    slots = {round((i + 0.5) * n / len(planned)): k for i, k in enumerate(planned)}
    kinds = [slots.get(i, "clean") for i in range(n)]
    script_rows: list[dict[str, Any]] = []
    specs, kind_of, questions = [], {}, {}
    for i, (row, kind) in enumerate(zip(rows, kinds)):
        rid = f"{prefix}-{i:04d}-{kind}".replace("*", "x")
        row = dict(row)
        marker = PLANNED.get(kind, ("", None))[0]
        if kind.startswith("question-"):
            name = kind.removeprefix("question-")
            suffix = HOSTILE_QUESTION_SUFFIXES.get(name) or UNCARRIABLE_QUESTION_SUFFIXES[name]
            row["question"] = f"{row['question']}\n\n{suffix}"
        elif kind in BOMB_EXPRESSIONS:
            row["question"] = f"{row['question']} (case {i})"
            script_rows.append({"question": row["question"], "expression": BOMB_EXPRESSIONS[kind]})
        elif marker:
            row["question"] = f"{row['question']}\n\n{marker}"
        specs.append(
            {
                "rollout_id": rid,
                "group_id": f"{prefix}-g{i // 4}",
                "row": row,
                "deadline_s": deadline_s,
                "max_attempts": MAX_ATTEMPTS,
            }
        )
        kind_of[rid] = kind
        questions[rid] = row["question"]
    script = workdir / "rows.jsonl"
    write_jsonl(rows, script)
    extra = workdir / "bomb-script.jsonl"
    extra.write_text("".join(json.dumps(r) + "\n" for r in script_rows))
    return Plan(specs, kind_of, questions, extra)
