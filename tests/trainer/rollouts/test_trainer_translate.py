"""(Rollout, recorded calls) -> verl AgentLoopOutputs, and verl's own GRPO estimator on them."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from calcx.api.models import RecordedCall, Rollout
from calcx.trainer.rollouts.rollout_request import rollout_id_for
from calcx.trainer.rollouts.rollout_samples import RolloutIncomplete, RolloutSamples
from calcx.trainer.rollouts.translate import translate_rollout
from calcx.trainer.run.report import count_incomplete


def _call(
    rid: str, aid: str, seq: int, prompt: list[int], response: list[int], *, status: int = 200, version: int = 3
) -> dict:
    return {
        "call_id": int(aid) * 100 + seq,
        "rollout_id": rid,
        "attempt_id": aid,
        "seq": seq,
        "request": {"messages": [{"role": "user", "content": str(prompt)}]},
        "response": {"choices": []},
        "prompt_token_ids": prompt,
        "response_token_ids": response,
        "response_logprobs": [-0.1 * (i + 1) for i in range(len(response))],
        "latency_s": 0.25,
        "policy_version": version,
        "endpoint": "http://127.0.0.1:1/v1",
        "status_code": status,
        "created_at": 1.0,
    }


def _rollout(
    rid: str, group: str, reward: float | None, attempts: list[tuple[str, str, str | None]], state: str = "SUCCEEDED"
) -> dict:
    return {
        "rollout_id": rid,
        "group_id": group,
        "row": {"id": "q1", "question": "2+3?", "result": "5", "chain": "", "source": "ape210k"},
        "state": state,
        "reward": reward,
        "max_attempts": 3,
        "policy_version": 3,
        "labels": {},
        "attempts": [{"attempt_id": a, "state": s, "reason": r, "created_at": 1.0} for a, s, r in attempts],
        "events": [],
        "created_at": 1.0,
    }


def _translate(rollout: dict, calls: list[dict], **lengths: Any) -> RolloutSamples:
    """`translate_rollout` on the models the client reads these answers as."""
    return translate_rollout(
        Rollout.model_validate(rollout), [RecordedCall.model_validate(c) for c in calls], **lengths
    )


def _two_turn_rollout(uid: str, session: int, reward: float) -> tuple[dict, list[dict]]:
    rid = rollout_id_for("train", 3, uid, session)
    system_and_question = [151644, 8948, 198, 17 + session, 151645]
    first_answer = [151657, 4913, 606, 151658]  # tool call
    tool_result = [151644, 872, 198, 20, 151645]  # tool message, then the model answers
    final_answer = [14374, 96704, 25, 220, 20, 151645]
    calls = [
        _call(rid, "1", 0, [1, 2, 3], [9, 9], version=2),  # failed first attempt: must be ignored
        _call(rid, "2", 1, system_and_question + first_answer + tool_result, final_answer),
        _call(rid, "2", 0, system_and_question, first_answer),
    ]
    return _rollout(rid, uid, reward, [("1", "FAILED", "model_unreachable"), ("2", "SUCCEEDED", None)]), calls


def test_latest_attempt_calls_become_ordered_samples_with_the_reward() -> None:
    rollout, calls = _two_turn_rollout("u1", 0, 1.0)
    out = _translate(rollout, calls, max_prompt_length=4096, max_response_length=2048, expected_group_id="u1")
    assert out.attempt_id == "2" and out.group_id == "u1" and out.skipped_calls == 1
    assert [s.seq for s in out.samples] == [0, 1]
    first, second = out.samples
    assert first.prompt_ids == [151644, 8948, 198, 17, 151645]
    assert first.response_ids == [151657, 4913, 606, 151658] and first.response_mask == [1, 1, 1, 1]
    assert second.prompt_ids[: len(first.prompt_ids) + len(first.response_ids)] == first.prompt_ids + first.response_ids
    assert second.response_logprobs == pytest.approx([-0.1 * (i + 1) for i in range(6)])
    assert [s.reward for s in out.samples] == [1.0, 1.0]
    assert (out.min_policy_version, out.max_policy_version) == (3, 3)


def test_lengths_are_capped_keeping_the_prompt_end() -> None:
    rollout, calls = _two_turn_rollout("u1", 0, 0.0)
    out = _translate(rollout, calls, max_prompt_length=4, max_response_length=3)
    second = out.samples[1]
    assert second.prompt_ids == calls[1]["prompt_token_ids"][-4:]
    assert second.response_ids == calls[1]["response_token_ids"][:3] and len(second.response_logprobs) == 3
    assert out.counters == {"prompt_truncated": 2, "response_truncated": 2}


@pytest.mark.parametrize(
    "change, reason",
    [
        (lambda r, c: r.update(state="FAILED"), "rollout_failed"),
        (lambda r, c: r.update(reward=None), "no_reward"),
        (lambda r, c: r.update(reward=float("nan")), "no_reward"),
        (lambda r, c: c.clear(), "no_calls"),
        (lambda r, c: c[1].update(response_logprobs=[0.0]), "bad_call_record"),
        (lambda r, c: r.update(group_id="other"), "wrong_group"),
    ],
)
def test_rollouts_that_cannot_be_trained_on_are_incomplete_not_zero(change, reason) -> None:
    rollout, calls = _two_turn_rollout("u1", 0, 1.0)
    change(rollout, calls)
    with pytest.raises(RolloutIncomplete) as info:
        _translate(rollout, calls, max_prompt_length=4096, max_response_length=2048, expected_group_id="u1")
    assert info.value.reason == reason and info.value.rollout_id == rollout["rollout_id"]


def test_non_200_and_empty_calls_are_skipped() -> None:
    rollout, calls = _two_turn_rollout("u1", 0, 1.0)
    # its own request, so it is left out for its status, not as one the empty call resends
    calls.append(_call(rollout["rollout_id"], "2", 2, [5, 6, 8], [7], status=502))
    calls.append(_call(rollout["rollout_id"], "2", 3, [5, 6], []))
    out = _translate(rollout, calls, max_prompt_length=4096, max_response_length=2048)
    assert len(out.samples) == 2 and out.skipped_calls == 3


def test_a_call_the_client_sent_again_is_trained_once_with_its_last_answer() -> None:
    """The agent's client resends a call (its timeout, a 502): the same request twice in one
    attempt. Training both answers would train the turn twice, once on an answer nobody used."""
    rollout, calls = _two_turn_rollout("u1", 0, 1.0)
    first = calls[2]
    calls.append(_call(rollout["rollout_id"], "2", 2, first["prompt_token_ids"], [4, 4, 4]))
    out = _translate(rollout, calls, max_prompt_length=4096, max_response_length=2048)
    assert len(out.samples) == 2 and out.skipped_calls == 2
    assert [s.response_ids for s in out.samples] == [calls[1]["response_token_ids"], [4, 4, 4]]


def test_verl_grpo_advantages_on_translated_outputs() -> None:
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    from calcx.trainer.workers.calcx_agent_loop import to_agent_loop_outputs

    rewards = {("g1", 0): 1.0, ("g1", 1): 0.0, ("g2", 0): 1.0, ("g2", 1): 1.0}
    rows, index = [], []
    for (uid, session), reward in rewards.items():
        rollout, calls = _two_turn_rollout(uid, session, reward)
        samples = _translate(rollout, calls, max_prompt_length=4096, max_response_length=2048, expected_group_id=uid)
        for output in to_agent_loop_outputs(samples, step=3):
            assert output.extra_fields["min_global_steps"] == 3 and output.extra_fields["reward_extra_info"] == {}
            rows.append(output.as_dict())  # verl's own conversion: rm_scores on the last response token
            index.append(uid)
    width = max(r["responses"].numel() for r in rows)
    scores = torch.zeros(len(rows), width)
    mask = torch.zeros(len(rows), width, dtype=torch.int64)
    for i, r in enumerate(rows):
        n = r["responses"].numel()
        scores[i, :n] = r["rm_scores"]
        mask[i, :n] = r["response_mask"]
        assert r["rollout_log_probs"].shape == (n,)
    adv, _ = compute_grpo_outcome_advantage(scores, mask, np.array(index, dtype=object))
    per_row = [float(adv[i, 0]) for i in range(len(rows))]
    # group g1: two calls of a rewarded rollout, two of an unrewarded one -> +a, +a, -a, -a
    assert per_row[0] == per_row[1] > 0 and per_row[2] == per_row[3] < 0
    assert math.isclose(per_row[0], -per_row[2], rel_tol=1e-5)
    # group g2: equal rewards -> no signal
    assert all(abs(v) < 1e-4 for v in per_row[4:])
    assert torch.all(adv[mask == 0] == 0)


def test_joined_calls_are_one_verl_row_and_one_member_of_their_group() -> None:
    """A rollout whose two calls continue each other is one row (its tool answer masked, log-prob 0),
    so a group of a two-call and a one-call rollout gives +a and -a: one row a call would have
    counted the two-call rollout twice in the group's mean and deviation."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    from calcx.trainer.rollouts.call_join import join_continued_calls
    from calcx.trainer.workers.calcx_agent_loop import to_agent_loop_outputs

    two_calls, calls = _two_turn_rollout("g1", 0, 1.0)
    joined = join_continued_calls(
        _translate(two_calls, calls, max_prompt_length=4096, max_response_length=2048), max_response_length=2048
    )
    [first, second] = sorted((c for c in calls if c["attempt_id"] == "2"), key=lambda c: c["seq"])
    one_call, _ = _two_turn_rollout("g1", 1, 0.0)
    single = _translate(
        one_call,
        [_call(one_call["rollout_id"], "2", 0, first["prompt_token_ids"], [7, 7])],
        max_prompt_length=4096,
        max_response_length=2048,
    )
    [row] = [o.as_dict() for o in to_agent_loop_outputs(joined, step=3)]
    [other] = [o.as_dict() for o in to_agent_loop_outputs(single, step=3)]
    between = len(second["prompt_token_ids"]) - len(first["prompt_token_ids"]) - len(first["response_token_ids"])
    assert row["prompts"].tolist() == first["prompt_token_ids"]
    assert (
        row["responses"].tolist()
        == second["prompt_token_ids"][len(first["prompt_token_ids"]) :] + second["response_token_ids"]
    )
    assert row["response_mask"].tolist() == [1] * len(first["response_token_ids"]) + [0] * between + [1] * len(
        second["response_token_ids"]
    )
    assert row["rollout_log_probs"].tolist()[len(first["response_token_ids"]) :][:between] == [0.0] * between
    assert [o.num_turns for o in to_agent_loop_outputs(joined, step=3)] == [4]

    width = max(row["responses"].numel(), other["responses"].numel())
    scores, mask = torch.zeros(2, width), torch.zeros(2, width, dtype=torch.int64)
    for i, r in enumerate((row, other)):
        n = r["responses"].numel()
        scores[i, :n], mask[i, :n] = r["rm_scores"], r["response_mask"]
    adv, _ = compute_grpo_outcome_advantage(scores, mask, np.array(["g1", "g1"], dtype=object))
    plus, minus = float(adv[0, 0]), float(adv[1, 0])
    assert plus > 0 and math.isclose(plus, -minus, rel_tol=1e-5)


def test_trajectory_versions_span_the_versions_that_served_its_calls() -> None:
    """A trajectory whose turns were answered by two policy versions tells verl both (verl's
    staleness is the trained step minus one minus the newest); one without recorded versions counts
    as on-policy for its step (the previous step's weights)."""
    from calcx.trainer.workers.calcx_agent_loop import to_agent_loop_outputs

    rollout, calls = _two_turn_rollout("g1", 0, 1.0)
    calls[1]["policy_version"], calls[2]["policy_version"] = 5, 4  # second turn after a weight sync
    samples = _translate(rollout, calls, max_prompt_length=4096, max_response_length=2048)
    spans = {
        (o.extra_fields["min_global_steps"], o.extra_fields["max_global_steps"])
        for o in to_agent_loop_outputs(samples, step=6)
    }
    assert spans == {(4, 5)}

    for call in calls:
        call["policy_version"] = None
    samples = _translate(rollout, calls, max_prompt_length=4096, max_response_length=2048)
    spans = {
        (o.extra_fields["min_global_steps"], o.extra_fields["max_global_steps"])
        for o in to_agent_loop_outputs(samples, step=6)
    }
    assert spans == {(5, 5)}


def test_incomplete_sessions_are_recorded_and_counted_per_group(tmp_path: Path) -> None:
    from calcx.trainer.rollouts.session import record_incomplete

    for session in (0, 1):
        exc = RolloutIncomplete(rollout_id_for("train", 5, "gX", session), "group_incomplete", "member failed")
        record_incomplete(tmp_path, exc, uid="gX", step=5)
    record_incomplete(tmp_path, RolloutIncomplete("r", "group_timeout"), uid="gY", step=6)
    lines = [json.loads(x) for x in (tmp_path / "incomplete_groups.jsonl").read_text().splitlines()]
    assert [x["reason"] for x in lines] == ["group_incomplete", "group_incomplete", "group_timeout"]
    assert count_incomplete(tmp_path / "incomplete_groups.jsonl") == 2
    assert count_incomplete(tmp_path / "absent.jsonl") == 0
