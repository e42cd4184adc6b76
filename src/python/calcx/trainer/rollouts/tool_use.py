"""How a rollout used the calculator, read from its recorded model calls: the one source of the
tool-use figures (the trainer's `calcx/{train,val}/...` metrics, `calcx runs table`, the
reward options).

A recorded call holds the OpenAI request the agent sent and the response vLLM gave. A tool call
the parser understood is in the response's `message.tool_calls`; its answer comes back as a
`role: tool` message (same `tool_call_id`) in the request of the agent's next call. An answer that
starts with "Error" is the calculator (FastMCP) or the agent's workbench refusing the call (bad
expression, unknown tool, bad arguments). A `<tool_call>` block the model wrote but vLLM's hermes
parser could not read (broken JSON) stays in `message.content` as text: a parse failure, the
model's own mistake. The reference steps are the distinct results of the row's GSM8K annotations
(`chain`, calcx.contract.chain); a step is computed when a successful call's answer (the
calculator prints Python's `str` of the value: `28`, `1200.0`) is that number (`same_number`), so
a call that only stamps the last trivial step computes one of them. Pure functions over
`calcx.api.models.RecordedCall`s, as the trainer reads them from the API and `calcx runs table`
from a store file: no server, no verl.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from calcx.api.models import RecordedCall
from calcx.contract.chain import parse_number, reference_results, same_number
from calcx.trainer.run_dir.names import TOOL_USE_FILE

CALCULATOR_TOOL = "calculate"
TOOL_CALL_TAG = "<tool_call>"
TOOL_ERROR_PREFIX = "Error"
PARTITIONS = ("train", "val")
# a ledger line is a few hundred bytes; anything longer is not one of ours and is skipped
MAX_LEDGER_LINE = 4096
# two trained rewards closer than this are equal (rewards are 0, 1 and 1 + a bonus)
EQUAL_REWARD_TOLERANCE = 1e-9


@dataclass(frozen=True)
class ToolUse:
    """One rollout's calculator use (latest attempt)."""

    calls: int = 0  # tool calls the parser turned into calls
    successful: int = 0  # `calculate` calls answered with a result, not an error
    parse_failures: int = 0  # `<tool_call>` blocks left in the text (unreadable to the parser)
    reference_steps: int = 0  # distinct results of the row's chain annotations (0: none to compare)
    steps_computed: int = 0  # of those, the ones a successful call returned

    @property
    def used_calculator(self) -> bool:
        return self.successful > 0

    @property
    def steps_share(self) -> float | None:
        """The share of the reference steps the calculator computed; None without any."""
        return self.steps_computed / self.reference_steps if self.reference_steps else None


@dataclass(frozen=True)
class RolloutShape:
    """What the trainer made of one rollout: its model calls kept as samples (latest attempt,
    answered, a resent call once) and the sequences it trains on (fewer where calls that continue
    each other were joined: calcx.trainer.rollouts.call_join)."""

    model_calls: int
    sequences: int


def message_of(response: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The assistant message of a recorded response ({} when there is none)."""
    if response is None:
        return {}
    try:
        message = response["choices"][0]["message"]
    except (TypeError, KeyError, IndexError):
        return {}
    return message if isinstance(message, Mapping) else {}


def text_of(content: Any) -> str:
    """A message's content as text (a string, or OpenAI's list of text parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


def tool_results(calls: Sequence[RecordedCall]) -> dict[str, str]:
    """`tool_call_id` -> the tool's answer, from every `role: tool` message the agent sent."""
    results: dict[str, str] = {}
    for call in calls:
        messages = call.request.get("messages")
        for message in messages if isinstance(messages, list) else []:
            if isinstance(message, Mapping) and message.get("role") == "tool":
                results[str(message.get("tool_call_id"))] = text_of(message.get("content"))
    return results


def attempt_calls(calls: Sequence[RecordedCall], attempt_id: str) -> list[RecordedCall]:
    """The calls of one attempt that were answered (status 200), in the agent's order."""
    kept = [c for c in calls if c.attempt_id == attempt_id and c.status_code == 200]
    return sorted(kept, key=lambda c: c.seq)


def computed_steps(reference: Sequence[float], answers: Iterable[str]) -> int:
    """How many of the reference results one of the calculator's answers is."""
    values = [v for v in (parse_number(a) for a in answers) if v is not None]
    return sum(any(same_number(r, v) for v in values) for r in reference)


def rollout_tool_use(calls: Sequence[RecordedCall], chain: str | None = None) -> ToolUse:
    """Tool use of one attempt's calls (the caller keeps the attempt it trains on, answered 200),
    with the reference steps of the row's `chain` it computed."""
    results = tool_results(calls)
    made = successful = failures = 0
    answers: list[str] = []
    for call in calls:
        message = message_of(call.response)
        tool_calls = message.get("tool_calls")
        for tool_call in tool_calls if isinstance(tool_calls, list) else []:
            made += 1
            function = tool_call.get("function") if isinstance(tool_call, Mapping) else None
            name = function.get("name") if isinstance(function, Mapping) else None
            answer = results.get(str(tool_call.get("id"))) if isinstance(tool_call, Mapping) else None
            if name == CALCULATOR_TOOL and answer is not None and not answer.lstrip().startswith(TOOL_ERROR_PREFIX):
                successful += 1
                answers.append(answer)
        failures += text_of(message.get("content")).count(TOOL_CALL_TAG)
    reference = reference_results(chain)
    return ToolUse(
        calls=made,
        successful=successful,
        parse_failures=failures,
        reference_steps=len(reference),
        steps_computed=computed_steps(reference, answers),
    )


def equal_reward_share(rewards: Mapping[str, Sequence[float]]) -> float | None:
    """The share of GRPO groups (group id -> its rollouts' trained rewards) whose rewards are all
    equal: GRPO gives each of their samples an advantage of 0, so they teach nothing. Groups of one
    rollout are not counted; None when no group has two."""
    groups = [values for values in rewards.values() if len(values) >= 2]
    if not groups:
        return None
    return sum(max(values) - min(values) <= EQUAL_REWARD_TOLERANCE for values in groups) / len(groups)


def tool_use_metrics(
    uses: Iterable[ToolUse],
    partition: str,
    shapes: Iterable[RolloutShape] = (),
    group_rewards: Mapping[str, Sequence[float]] | None = None,
) -> dict[str, float]:
    """`calcx/{partition}/...`: share of rollouts with >= 1 successful calculator call, tool calls
    per rollout, parse failures (count, and share of all tool-call attempts); with `shapes`, model
    calls and trained sequences per rollout; with `group_rewards`, the share of groups whose rewards
    are all equal (`equal_reward_groups`); `steps_computed`, the mean share of the reference steps
    the calculator computed over the rollouts whose row has any. Empty: no metric."""
    items = list(uses)
    if not items:
        return {}
    made = sum(u.calls for u in items)
    failures = sum(u.parse_failures for u in items)
    prefix = f"calcx/{partition}"
    metrics = {
        f"{prefix}/tool_use": sum(u.used_calculator for u in items) / len(items),
        f"{prefix}/tool_calls_per_rollout": made / len(items),
        f"{prefix}/tool_parse_failures": float(failures),
        f"{prefix}/tool_parse_failure_share": failures / (made + failures) if made + failures else 0.0,
        f"{prefix}/rollouts": float(len(items)),
    }
    shares = [u.steps_share for u in items if u.steps_share is not None]
    if shares:
        metrics[f"{prefix}/steps_computed"] = sum(shares) / len(shares)
    measured = list(shapes)
    if measured:
        metrics[f"{prefix}/model_calls_per_rollout"] = sum(s.model_calls for s in measured) / len(measured)
        metrics[f"{prefix}/sequences_per_rollout"] = sum(s.sequences for s in measured) / len(measured)
    equal = equal_reward_share(group_rewards or {})
    if equal is not None:
        metrics[f"{prefix}/equal_reward_groups"] = equal
    return metrics


def record_tool_use(
    report_dir: str | os.PathLike[str],
    *,
    partition: str,
    step: int,
    rollout_id: str,
    use: ToolUse,
    shape: RolloutShape | None = None,
    group: str | None = None,
    reward: float | None = None,
) -> None:
    """Append the rollout's tool use (and shape, GRPO group and trained reward, when given) to
    `{report_dir}/tool_use.jsonl` (one short line, appended in one write, so the agent loop workers
    can share the file)."""
    path = Path(report_dir) / TOOL_USE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    scored = {"group": group, "reward": reward} if group is not None and reward is not None else {}
    line = json.dumps(
        {
            "partition": partition,
            "step": step,
            "rollout_id": rollout_id,
            **asdict(use),
            **(asdict(shape) if shape is not None else {}),
            **scored,
        }
    )
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


class ToolUseLedger:
    """Reads `tool_use.jsonl` as it grows and hands out the rollouts recorded since the last take of
    each partition (a rollout recorded twice counts once). Starts at the file's end: a resumed
    run's earlier lines are not this run's steps."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._offset = self.path.stat().st_size if self.path.exists() else 0
        self._pending: dict[str, dict[str, ToolUse]] = {p: {} for p in PARTITIONS}
        self._shapes: dict[str, dict[str, RolloutShape]] = {p: {} for p in PARTITIONS}
        self._scored: dict[str, dict[str, tuple[str, float]]] = {p: {} for p in PARTITIONS}

    def _read_new(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as fh:
            fh.seek(self._offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
        self._offset += end
        for raw in data[:end].splitlines():
            if not raw.strip() or len(raw) > MAX_LEDGER_LINE:
                continue
            try:
                record = json.loads(raw)
                use = ToolUse(
                    int(record["calls"]),
                    int(record["successful"]),
                    int(record["parse_failures"]),
                    int(record.get("reference_steps", 0)),
                    int(record.get("steps_computed", 0)),
                )
                shape = (
                    RolloutShape(int(record["model_calls"]), int(record["sequences"]))
                    if "sequences" in record
                    else None
                )
                scored = (
                    (str(record["group"]), float(record["reward"]))
                    if record.get("group") is not None and record.get("reward") is not None
                    else None
                )
                partition, rollout_id = str(record["partition"]), str(record["rollout_id"])
                pending = self._pending[partition]
            except (ValueError, KeyError, TypeError):
                continue
            pending[rollout_id] = use
            if shape is not None:
                self._shapes[partition][rollout_id] = shape
            if scored is not None:
                self._scored[partition][rollout_id] = scored

    def take(self, partition: str) -> dict[str, float]:
        """The metrics of the partition's rollouts recorded since its last take ({} when none)."""
        self._read_new()
        uses = list(self._pending[partition].values())
        shapes = list(self._shapes[partition].values())
        rewards: dict[str, list[float]] = {}
        for group, reward in self._scored[partition].values():
            rewards.setdefault(group, []).append(reward)
        self._pending[partition], self._shapes[partition], self._scored[partition] = {}, {}, {}
        return tool_use_metrics(uses, partition, shapes, rewards)


def add_tool_use_metrics(trainer: Any, ledger: ToolUseLedger) -> None:
    """Make verl's V1 trainer log `calcx/val/...` with each validation's metrics and `calcx/train/...`
    with each step's: `_validate()` returns the dict verl logs, `_compute_metrics(batch, metrics,
    ...)` fills the step's dict before verl logs it."""
    validate: Callable[..., dict[str, Any]] = trainer._validate
    compute: Callable[..., Any] = trainer._compute_metrics

    def validate_then_measure(*args: Any, **kwargs: Any) -> dict[str, Any]:
        metrics = validate(*args, **kwargs)
        metrics.update(ledger.take("val"))
        return metrics

    def compute_then_measure(batch: Any, metrics: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        result = compute(batch, metrics, *args, **kwargs)
        metrics.update(ledger.take("train"))
        return result

    trainer._validate = validate_then_measure
    trainer._compute_metrics = compute_then_measure
