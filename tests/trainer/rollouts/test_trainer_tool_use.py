"""Calculator use counted from recorded model calls (`calcx.trainer.rollouts.tool_use`), the ledger the
AgentLoop sessions write, and the hook that puts `calcx/{train,val}/...` into verl's step metrics.

The recorded calls are shaped as the gateway stores them for calcx's AutoGen agent: the first
call's response carries the parsed tool calls, the next call's request carries the tool answers
(`role: tool`), and a `<tool_call>` vLLM's hermes parser could not read stays in the text.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from calcx.api.models import RecordedCall
from calcx.trainer.rollouts.tool_use import (
    RolloutShape,
    ToolUse,
    ToolUseLedger,
    add_tool_use_metrics,
    attempt_calls,
    equal_reward_share,
    record_tool_use,
    rollout_tool_use,
    tool_use_metrics,
)
from calcx.trainer.run_dir.names import TOOL_USE_FILE

SYSTEM = {"role": "system", "content": "You are a careful math assistant."}
USER = {"role": "user", "content": "Natalia sold 48 clips ..."}


def tool_call(call_id: str, expression: str, name: str = "calculate") -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps({"expression": expression})},
    }


def response(content: str | None = None, tool_calls: list | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    return {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}]}


def recorded(seq: int, messages: list, answer: dict | None, attempt: str = "a1", status: int = 200) -> RecordedCall:
    return RecordedCall(
        call_id=seq,
        rollout_id="r",
        attempt_id=attempt,
        seq=seq,
        status_code=status,
        request={"model": "m", "messages": messages},
        response=answer,
        latency_s=0.1,
        created_at=1.0,
    )


def agent_calls(results: dict[str, str], calls: list[dict]) -> list[RecordedCall]:
    """A tool-calling turn, then the reflection turn that sees the tool answers."""
    first = response(None, calls)
    tool_messages = [{"role": "tool", "tool_call_id": cid, "content": text} for cid, text in results.items()]
    second_request = [SYSTEM, USER, first["choices"][0]["message"], *tool_messages]
    return [
        recorded(0, [SYSTEM, USER], first),
        recorded(1, second_request, response("48/2 = 24, so 72.\n### ANSWER: 72 ###")),
    ]


def test_a_call_the_calculator_answered_is_a_successful_one() -> None:
    calls = agent_calls(
        {"c1": "24.0", "c2": "Error executing tool calculate: division by zero"},
        [tool_call("c1", "48/2"), tool_call("c2", "1/0")],
    )
    assert rollout_tool_use(calls) == ToolUse(calls=2, successful=1, parse_failures=0)
    assert rollout_tool_use(calls).used_calculator


def test_errors_unknown_tools_and_unanswered_calls_are_not_successful() -> None:
    refused = agent_calls({"c1": "Error: Expecting value: line 1 column 1"}, [tool_call("c1", "48/")])
    assert rollout_tool_use(refused) == ToolUse(calls=1, successful=0, parse_failures=0)
    other_tool = agent_calls({"c1": "24"}, [tool_call("c1", "48/2", name="search")])
    assert rollout_tool_use(other_tool).successful == 0
    # the run ended before the agent sent the tool's answer back
    unanswered = [recorded(0, [SYSTEM, USER], response(None, [tool_call("c1", "48/2")]))]
    assert rollout_tool_use(unanswered) == ToolUse(calls=1, successful=0, parse_failures=0)


def test_a_tool_call_the_parser_left_as_text_is_a_parse_failure() -> None:
    broken = (
        '<tool_call>\n{"name": "calculate", "arguments": {"expression": "48/2"</tool_call>\n'
        '<tool_call>\n{"name": calculate}\n</tool_call>'
    )
    calls = [
        recorded(0, [SYSTEM, USER], response(broken, [])),
        recorded(1, [SYSTEM, USER], response("### ANSWER: 72 ###")),
    ]
    use = rollout_tool_use(calls)
    assert use == ToolUse(calls=0, successful=0, parse_failures=2) and not use.used_calculator


# GSM8K's reference solution of a two-step problem: its calculator steps are 12 and 28
TWO_STEPS = "She made 3*4 = <<3*4=12>>12 cups, then 12 + 16 = <<12+16=28>>28 in all.\n#### 28"


def test_a_stamp_call_of_the_last_step_computes_one_of_two() -> None:
    """The arithmetic done in the text, then one call of the last trivial step."""
    calls = agent_calls({"c1": "28"}, [tool_call("c1", "(12 + 16)")])
    use = rollout_tool_use(calls, TWO_STEPS)
    assert use == ToolUse(calls=1, successful=1, parse_failures=0, reference_steps=2, steps_computed=1)
    assert use.steps_share == 0.5
    assert rollout_tool_use(calls).steps_share is None  # no chain: nothing to compare with


def test_every_step_computed_covers_the_chain() -> None:
    calls = agent_calls({"c1": "12", "c2": "28"}, [tool_call("c1", "3*4"), tool_call("c2", "12+16")])
    assert rollout_tool_use(calls, TWO_STEPS).steps_share == 1.0
    # a step computed twice is still one step
    again = agent_calls({"c1": "28", "c2": "28.0"}, [tool_call("c1", "12+16"), tool_call("c2", "16+12")])
    assert rollout_tool_use(again, TWO_STEPS).steps_computed == 1


def test_a_failed_call_computes_no_step() -> None:
    """Only a successful `calculate` call's answer counts: not another tool's answer, not a refusal,
    not a call the agent never answered."""
    other_tool = agent_calls({"c1": "12"}, [tool_call("c1", "3*4", name="search")])
    refused = agent_calls({"c1": "Error executing tool calculate: 28 is not 12"}, [tool_call("c1", "3*4")])
    unanswered = [recorded(0, [SYSTEM, USER], response(None, [tool_call("c1", "3*4")]))]
    for calls in (other_tool, refused, unanswered):
        use = rollout_tool_use(calls, TWO_STEPS)
        assert (use.reference_steps, use.steps_computed, use.successful) == (2, 0, 0)


def test_steps_are_compared_as_numbers() -> None:
    """GSM8K writes `1,200`, the calculator prints Python's float `1200.0`; a result written twice is
    one step; a mark whose result is no number is none; float noise is equality."""
    chain = "<<12*100=1,200>>1,200 <<1200/4=300>>300 <<150*2=300>>300 <<x=y>> <<0.1+0.2=0.3>>0.3"
    calls = agent_calls(
        {"c1": "1200.0", "c2": "0.30000000000000004", "c3": "301"},
        [tool_call("c1", "12*100"), tool_call("c2", "0.1+0.2"), tool_call("c3", "300+1")],
    )
    use = rollout_tool_use(calls, chain)
    assert (use.reference_steps, use.steps_computed) == (3, 2)
    assert rollout_tool_use(calls, "no marks here: a Calc-X <gadget> chain").reference_steps == 0


def test_only_the_answered_calls_of_the_trained_attempt_count() -> None:
    first = agent_calls({"c1": "24.0"}, [tool_call("c1", "48/2")])
    old = [c.model_copy(update={"attempt_id": "a0"}) for c in first]
    failed = recorded(2, [SYSTEM, USER], None, attempt="a1", status=502)
    kept = attempt_calls([*old, failed, *reversed(first)], "a1")
    assert [c.seq for c in kept] == [0, 1] and all(c.attempt_id == "a1" for c in kept)


def test_metrics_of_a_step() -> None:
    uses = [ToolUse(2, 1, 0), ToolUse(0, 0, 1), ToolUse(1, 1, 0), ToolUse(0, 0, 0)]
    assert tool_use_metrics(uses, "val") == {
        "calcx/val/tool_use": 0.5,
        "calcx/val/tool_calls_per_rollout": 0.75,
        "calcx/val/tool_parse_failures": 1.0,
        "calcx/val/tool_parse_failure_share": 0.25,
        "calcx/val/rollouts": 4.0,
    }
    assert tool_use_metrics([], "train") == {}  # nothing measured is not 0% tool use
    shaped = tool_use_metrics(uses, "train", [RolloutShape(4, 1), RolloutShape(2, 2)])
    assert (shaped["calcx/train/model_calls_per_rollout"], shaped["calcx/train/sequences_per_rollout"]) == (3.0, 1.5)
    assert "calcx/val/sequences_per_rollout" not in tool_use_metrics(uses, "val")  # not recorded: no figure


def test_steps_computed_is_the_mean_share_over_the_rollouts_with_reference_steps() -> None:
    uses = [ToolUse(1, 1, 0, 2, 1), ToolUse(2, 2, 0, 2, 2), ToolUse(0, 0, 0, 4, 0), ToolUse(1, 1, 0, 0, 0)]
    # 1/2, 2/2 and 0/4; the rollout whose row has no annotation is not counted
    assert tool_use_metrics(uses, "train")["calcx/train/steps_computed"] == 0.5
    assert "calcx/val/steps_computed" not in tool_use_metrics([ToolUse(1, 1, 0)], "val")  # none to compare


def test_the_ledger_carries_the_reference_steps(tmp_path: Path) -> None:
    (tmp_path / TOOL_USE_FILE).touch()
    ledger = ToolUseLedger(tmp_path / TOOL_USE_FILE)
    record_tool_use(tmp_path, partition="val", step=1, rollout_id="v1", use=ToolUse(1, 1, 0, 2, 1))
    record_tool_use(tmp_path, partition="val", step=1, rollout_id="v2", use=ToolUse(1, 1, 0, 4, 4))
    line = json.loads((tmp_path / TOOL_USE_FILE).read_text().splitlines()[0])
    assert (line["reference_steps"], line["steps_computed"]) == (2, 1)
    with open(tmp_path / TOOL_USE_FILE, "a") as fh:  # a line of an older trainer: no reference steps
        fh.write(
            '{"partition": "val", "step": 1, "rollout_id": "v3", "calls": 1, "successful": 1, "parse_failures": 0}\n'
        )
    val = ledger.take("val")
    assert val["calcx/val/steps_computed"] == 0.75 and val["calcx/val/rollouts"] == 3


def test_ledger_hands_out_each_rollout_once_per_partition(tmp_path: Path) -> None:
    (tmp_path / TOOL_USE_FILE).write_text(
        json.dumps(
            {"partition": "train", "step": 0, "rollout_id": "old", "calls": 9, "successful": 9, "parse_failures": 0}
        )
        + "\n"
    )
    ledger = ToolUseLedger(tmp_path / TOOL_USE_FILE)  # a resumed run: earlier lines are not this run's
    record_tool_use(tmp_path, partition="train", step=1, rollout_id="r1", use=ToolUse(1, 1, 0))
    record_tool_use(tmp_path, partition="train", step=1, rollout_id="r2", use=ToolUse(0, 0, 2))
    record_tool_use(tmp_path, partition="val", step=1, rollout_id="v1", use=ToolUse(1, 1, 0))
    record_tool_use(tmp_path, partition="train", step=1, rollout_id="r1", use=ToolUse(1, 1, 0))  # again
    with open(tmp_path / TOOL_USE_FILE, "a") as fh:
        fh.write('{"partition": "train", "step": 2, "rollout_id": "r3", "calls": 1')  # still being written
    assert ledger.take("val")["calcx/val/tool_use"] == 1.0
    train = ledger.take("train")
    assert train["calcx/train/rollouts"] == 2 and train["calcx/train/tool_use"] == 0.5
    assert train["calcx/train/tool_parse_failures"] == 2
    assert ledger.take("train") == {} and ledger.take("val") == {}
    with open(tmp_path / TOOL_USE_FILE, "a") as fh:
        fh.write(', "successful": 0, "parse_failures": 0}\n')
    assert ledger.take("train")["calcx/train/rollouts"] == 1


def test_ledger_reports_calls_and_sequences_a_rollout_where_recorded(tmp_path: Path) -> None:
    ledger = ToolUseLedger(tmp_path / TOOL_USE_FILE)
    record_tool_use(
        tmp_path,
        partition="train",
        step=1,
        rollout_id="r1",
        use=ToolUse(3, 3, 0),
        shape=RolloutShape(model_calls=4, sequences=1),
    )
    record_tool_use(
        tmp_path,
        partition="train",
        step=1,
        rollout_id="r2",
        use=ToolUse(1, 1, 0),
        shape=RolloutShape(model_calls=2, sequences=2),
    )
    record_tool_use(
        tmp_path,
        partition="train",
        step=1,
        rollout_id="r1",
        use=ToolUse(3, 3, 0),
        shape=RolloutShape(model_calls=4, sequences=1),
    )  # again: counts once
    train = ledger.take("train")
    assert (train["calcx/train/model_calls_per_rollout"], train["calcx/train/sequences_per_rollout"]) == (3.0, 1.5)
    record_tool_use(tmp_path, partition="train", step=2, rollout_id="r3", use=ToolUse(1, 1, 0))
    assert "calcx/train/sequences_per_rollout" not in ledger.take("train")  # taken with step 1's


def test_share_of_groups_whose_rewards_are_all_equal() -> None:
    groups = {"a": [1.0, 1.0, 1.0, 1.0], "b": [0.0, 0.0, 0.0, 0.0], "c": [1.1, 1.0, 1.0, 1.0], "d": [0.0, 1.0]}
    assert equal_reward_share(groups) == 0.5  # a and b teach nothing; c (the bonus) and d do
    assert equal_reward_share({**groups, "e": [1.0]}) == 0.5  # a group of one is no group
    assert equal_reward_share({"e": [1.0]}) is None and equal_reward_share({}) is None


def test_ledger_reports_the_equal_reward_groups_of_a_step(tmp_path: Path) -> None:
    ledger = ToolUseLedger(tmp_path / TOOL_USE_FILE)
    rewards = {"g1": [1.0, 1.0], "g2": [0.0, 1.1], "g3": [0.0, 0.0], "g4": [1.0, 0.0]}
    for group, values in rewards.items():
        for i, reward in enumerate(values):
            record_tool_use(
                tmp_path,
                partition="train",
                step=1,
                rollout_id=f"{group}-{i}",
                use=ToolUse(1, 1, 0),
                group=group,
                reward=reward,
            )
    # a rollout recorded twice counts once, with its last reward: g4 becomes [1.0, 1.0]
    record_tool_use(
        tmp_path, partition="train", step=1, rollout_id="g4-1", use=ToolUse(1, 1, 0), group="g4", reward=1.0
    )
    record_tool_use(tmp_path, partition="val", step=1, rollout_id="v1", use=ToolUse(1, 1, 0), group="v", reward=1.0)
    train = ledger.take("train")
    assert train["calcx/train/equal_reward_groups"] == 3 / 4
    assert "calcx/val/equal_reward_groups" not in ledger.take("val")  # validation groups are of one
    record_tool_use(tmp_path, partition="train", step=2, rollout_id="r9", use=ToolUse(1, 1, 0))
    assert "calcx/train/equal_reward_groups" not in ledger.take("train")  # no reward recorded this step


class FakeTrainer:
    """The two methods of verl's V1 trainer that the hook wraps, called as its `fit()` calls them."""

    def _validate(self) -> dict[str, Any]:
        return {"val-core/gsm8k/reward/mean@1": 0.5}

    def _compute_metrics(self, batch: Any, metrics: dict, timing_raw: dict, global_steps: int, epoch: int) -> None:
        metrics["critic/score/mean"] = 0.25


def test_hook_adds_tool_use_to_the_metrics_verl_logs(tmp_path: Path) -> None:
    trainer = FakeTrainer()
    add_tool_use_metrics(trainer, ToolUseLedger(tmp_path / TOOL_USE_FILE))
    record_tool_use(tmp_path, partition="val", step=0, rollout_id="v1", use=ToolUse(1, 1, 0))
    val = trainer._validate()
    assert val["val-core/gsm8k/reward/mean@1"] == 0.5 and val["calcx/val/tool_use"] == 1.0
    record_tool_use(tmp_path, partition="train", step=1, rollout_id="t1", use=ToolUse(0, 0, 1))
    metrics: dict[str, Any] = {}
    trainer._compute_metrics(None, metrics, {}, global_steps=1, epoch=0)
    assert metrics["critic/score/mean"] == 0.25 and metrics["calcx/train/tool_use"] == 0.0
    assert metrics["calcx/train/tool_parse_failures"] == 1 and "calcx/val/tool_use" not in metrics


def test_verl_trainer_still_has_what_the_hook_wraps() -> None:
    """verl 0.9.1's V1 `fit()` logs `_validate()`'s dict and fills the step's dict in
    `_compute_metrics(batch, metrics, ...)` before logging it (read from its source: importing the
    module needs TransferQueue, which the CPU resolve does not hold)."""
    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.origin is not None
    source = (Path(spec.origin).parent / "trainer" / "ppo" / "v1" / "trainer_base.py").read_text()
    assert "def _validate(self) -> dict[str, float]:" in source
    assert "self._compute_metrics(batch, metrics, self.timing_raw" in source
    fit = source[source.index("    def fit(self") : source.index("    def step(self")]
    assert fit.index("self._compute_metrics(batch, metrics") < fit.index("self.logger.log(data=metrics")
    assert "val_metrics = self._validate()" in fit and "metrics.update(val_metrics)" in fit
