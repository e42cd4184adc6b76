"""The AgentLoop bridge against the real stack: calcx server + local-runner controller + stub LLM.

`CalcxAgentLoop.run` itself is driven (the object is made without verl's tokenizer machinery, which
`run` does not use), for GRPO groups of n=4: prompt/response ids, masks, log-probs, rewards and
group ids as verl receives them, verl's own GRPO estimator on them, and an infrastructure failure
retried as new attempts and then left out of the step, never scored 0. Then `--eval-only`'s
driver and the report read the validation rollouts back from the server.

The services run under a Python that has the CPU packages (fastapi, prometheus-client, autogen,
mcp, ...): `$CALCX_SERVICES_PYTHON`, default /opt/calcx-dev/bin/python.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from live_stack import SERVICES_PYTHON, agent_loop, alive, needs_services, stack_rollouts, start_stub

from calcx.api.client import AsyncCalcxClient
from calcx.trainer.config.compose import ComposeRequest, compose
from calcx.trainer.rollouts.rollout_samples import RolloutIncomplete
from calcx.trainer.run.report import count_incomplete
from calcx.trainer.run.services import CALCX_SRC, LocalServices, ServicesConfig
from calcx.trainer.run_dir.server_key import write_key_file

pytestmark = [needs_services, pytest.mark.timeout(420)]
N = 4


def _rows() -> list[dict[str, Any]]:
    from calcx.data.generator import generate_split

    good, wrong, broken = generate_split("train", 3, seed=11)
    wrong = {**wrong, "question": "[stub:wrong] " + wrong["question"]}
    broken = {**broken, "question": "[stub:http500] " + broken["question"]}
    return [good, wrong, broken]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("live-bridge")
    rows = _rows()
    config = ServicesConfig(
        workdir=work / "services",
        services_python=SERVICES_PYTHON,
        services_pythonpath=[str(CALCX_SRC)],
        agent_python=SERVICES_PYTHON,
        agent_pythonpath=[str(CALCX_SRC)],
        concurrency=8,
        server_args=["--upstream-retries", "0"],
    )
    services = LocalServices(config)
    stub = None
    try:
        services.start()
        stub, stub_url = start_stub(work, rows)
        yield {"work": work, "rows": rows, "services": services, "stub_url": stub_url}
    finally:
        pids = services.pids() | ({stub.pid} if stub is not None and stub.alive() else set())
        if stub is not None:
            stub.stop()
        services.stop()
        assert not [p for p in pids if alive(p)], "a process outlived the stack"


def _config(stack: dict, report_dir: Path, *extra: str):
    key_file = write_key_file(stack["services"].key)  # as calcx train hands the key to its workers
    cfg = compose(
        ComposeRequest(
            model="calcx-stub",
            server_url=stack["services"].server_url,
            dotlist=[
                f"calcx.key_file={key_file}",
                f"calcx.report_dir={report_dir}",
                "calcx.max_attempts=2",
                "calcx.deadline_s=90",
                "calcx.wait_timeout_s=5",
                "calcx.group_timeout_s=300",
                "actor_rollout_ref.rollout.n=4",
                *extra,
            ],
        )
    )
    from omegaconf import OmegaConf

    OmegaConf.resolve(cfg)  # as verl's TaskRunner does before any worker sees it
    return cfg


async def _group(cfg, row: dict, uid: str, step: int) -> list[Any]:
    from calcx.trainer.run.data import verl_records

    columns = verl_records([row])[0]
    params = {"temperature": float(cfg.actor_rollout_ref.rollout.temperature), "top_p": 1.0}
    sessions = [
        agent_loop(cfg).run(params, uid=uid, session_id=i, global_steps=step, index=0, **columns) for i in range(N)
    ]
    return await asyncio.gather(*sessions, return_exceptions=True)


async def _register(stack: dict, model: str) -> None:
    client = AsyncCalcxClient(stack["services"].server_url, stack["services"].key)
    try:
        await client.put_models(model, [stack["stub_url"]], 0)
    finally:
        await client.aclose()


async def _forwarded(stack: dict, rollout_id: str) -> list[dict]:
    """The requests the gateway forwarded to the model for the rollout (as it recorded them)."""
    client = AsyncCalcxClient(stack["services"].server_url, stack["services"].key)
    try:
        return [c.request for c in await client.calls(rollout_id)]
    finally:
        await client.aclose()


def test_grpo_groups_through_the_agent_loop(stack: dict, tmp_path: Path) -> None:
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    cfg = _config(stack, tmp_path / "report")
    good, wrong, broken = stack["rows"]

    async def scenario():
        await _register(stack, "calcx-stub")
        return await asyncio.gather(
            _group(cfg, good, "uid-good", 1), _group(cfg, wrong, "uid-wrong", 1), _group(cfg, broken, "uid-broken", 1)
        )

    results = asyncio.run(scenario())
    rollouts = asyncio.run(stack_rollouts(stack))

    rows, index = [], []
    for uid, sessions, reward in (("uid-good", results[0], 1.0), ("uid-wrong", results[1], 0.0)):
        for session, outputs in enumerate(sessions):
            assert isinstance(outputs, list) and outputs, f"{uid}/{session}: {outputs!r}"
            rid = f"calcx-train-s1-{uid}-{session}"
            assert rollouts[rid]["group_id"] == uid and rollouts[rid]["state"] == "SUCCEEDED"
            assert len(outputs) >= 2  # the tool call, then the answer
            for out in outputs:
                assert out.extra_fields["calcx_rollout_id"] == rid
                assert out.reward_score == reward
                assert out.prompt_ids and all(isinstance(t, int) for t in out.prompt_ids)
                assert out.response_ids and out.response_mask == [1] * len(out.response_ids)
                assert len(out.response_logprobs) == len(out.response_ids)
                assert all(lp <= 0.0 for lp in out.response_logprobs)
                # calls carry the version registered when they were made (0: the weights a step-1
                # rollout is generated with), not the step their group was created for
                assert out.extra_fields["min_global_steps"] == out.extra_fields["max_global_steps"] == 0
                rows.append(out.as_dict())
                index.append(uid)
            # one output per recorded call, in call order, the first one the tool call (<tool_call> = 3)
            call_ids = [int(o.extra_fields["calcx_call_id"]) for o in outputs]
            assert call_ids == sorted(set(call_ids)) and outputs[0].response_ids[0] == 3

    width = max(r["responses"].numel() for r in rows)
    scores = torch.zeros(len(rows), width)
    mask = torch.zeros(len(rows), width, dtype=torch.int64)
    for i, r in enumerate(rows):
        n = r["responses"].numel()
        scores[i, :n], mask[i, :n] = r["rm_scores"], r["response_mask"]
    # per GRPO group (verl uid): all four answers alike -> no advantage
    adv, _ = compute_grpo_outcome_advantage(scores, mask, np.array(index, dtype=object))
    assert torch.all(adv.abs() < 1e-4)
    # the same outputs as one group of 8: right answers up, wrong ones down, padding untouched
    merged, _ = compute_grpo_outcome_advantage(scores, mask, np.array(["all"] * len(rows), dtype=object))
    per_row = [float(merged[i, 0]) for i in range(len(rows))]
    good_rows = index.count("uid-good")
    assert all(v > 0.5 for v in per_row[:good_rows]) and all(v < -0.5 for v in per_row[good_rows:])
    assert torch.all(merged[mask == 0] == 0)

    # the http500 group: every session raised, every member was retried, nothing scored 0
    assert all(isinstance(s, RolloutIncomplete) for s in results[2]), results[2]
    for session in range(N):
        r = rollouts[f"calcx-train-s1-uid-broken-{session}"]
        assert r["state"] == "FAILED" and r["reward"] is None
        assert len(r["attempts"]) == 2 and {a["reason"] for a in r["attempts"]} == {"model_unreachable"}
    assert count_incomplete(tmp_path / "report" / "incomplete_groups.jsonl") == 1
    lines = [json.loads(x) for x in (tmp_path / "report" / "incomplete_groups.jsonl").read_text().splitlines()]
    assert {x["uid"] for x in lines} == {"uid-broken"} and len(lines) == N

    # every trained rollout's calculator use, counted from its recorded calls, for the step's
    # calcx/train/... metrics: the stub called the calculator once and the calculator answered
    ledger = [json.loads(x) for x in (tmp_path / "report" / "tool_use.jsonl").read_text().splitlines()]
    assert {x["rollout_id"] for x in ledger} == {
        f"calcx-train-s1-uid-{g}-{s}" for g in ("good", "wrong") for s in range(N)
    } and len(ledger) == 2 * N
    assert all(
        (x["partition"], x["step"], x["calls"], x["successful"], x["parse_failures"]) == ("train", 1, 1, 1, 0)
        for x in ledger
    ), ledger

    # every session's start and return, beside the server's clocks (the step table's wait split)
    times = {
        x["rollout_id"]: x
        for x in map(json.loads, (tmp_path / "report" / "session_times.jsonl").read_text().splitlines())
    }
    assert set(times) == {f"calcx-train-s1-uid-{g}-{s}" for g in ("good", "wrong", "broken") for s in range(N)}
    assert all(x["ok"] is (not rid.startswith("calcx-train-s1-uid-broken")) for rid, x in times.items())
    for rid, x in times.items():
        finished = max(a["finished_at"] for a in rollouts[rid]["attempts"])
        assert x["entered"] <= rollouts[rid]["created_at"] <= finished <= x["returned"], (rid, x)


def test_reward_options_shape_training_rollouts_not_validation(stack: dict, tmp_path: Path) -> None:
    """`calcx.reward.tool_bonus`: a right answer reached with the calculator trains with 1 + bonus;
    the same row validated keeps the agent's reward, and the server keeps what the agent posted."""
    from calcx.trainer.rollouts.session import run_session_from_config
    from calcx.trainer.run.evaluation import val_session_kwargs

    cfg = _config(stack, tmp_path / "report", "calcx.reward.tool_bonus=0.5")
    good = stack["rows"][0]

    async def scenario():
        await _register(stack, "calcx-stub")
        train = await _group(cfg, good, "uid-bonus", 3)
        val = await run_session_from_config(
            cfg, {}, val_session_kwargs(good, uid="uid-bonus-val", session_id=0, step=3)
        )
        return train, val

    train, val = asyncio.run(scenario())
    assert all(isinstance(outputs, list) and outputs for outputs in train), train
    assert {out.reward_score for outputs in train for out in outputs} == {1.5}
    assert {sample.reward for sample in val.samples} == {1.0}
    rollouts = asyncio.run(stack_rollouts(stack))
    assert {rollouts[f"calcx-train-s3-uid-bonus-{i}"]["reward"] for i in range(N)} == {1.0}


def test_the_steps_bonus_pays_the_reference_steps_the_calculator_computed(stack: dict, tmp_path: Path) -> None:
    """`calcx.reward.tool_bonus_for=steps` on a row with GSM8K's annotations: the stub calls the
    calculator for the last step only (`24 + 9`), one of the chain's two, so a right answer trains
    with 1 + bonus / 2; each session's `tool_use.jsonl` line, train and validation, carries the count."""
    from calcx.trainer.rollouts.session import run_session_from_config
    from calcx.trainer.run.evaluation import val_session_kwargs
    from calcx.trainer.run_dir.names import TOOL_USE_FILE

    report = tmp_path / "report"
    cfg = _config(stack, report, "calcx.reward.tool_bonus=0.5", "calcx.reward.tool_bonus_for=steps")
    good = stack["rows"][0]
    # the stub's call is the last of the generated row's own steps, `24 + 9`
    row = {**good, "chain": "336 / 14 = <<336/14=24>>24 in a bag; 24 + 9 = <<24+9=33>>33.\n#### 33"}

    async def scenario():
        await _register(stack, "calcx-stub")
        train = await _group(cfg, row, "uid-steps", 4)
        val = await run_session_from_config(cfg, {}, val_session_kwargs(row, uid="uid-steps-val", session_id=0, step=4))
        return train, val

    train, val = asyncio.run(scenario())
    assert all(isinstance(outputs, list) and outputs for outputs in train), train
    assert {out.reward_score for outputs in train for out in outputs} == {1.25}
    assert {sample.reward for sample in val.samples} == {1.0}
    lines = [json.loads(line) for line in (report / TOOL_USE_FILE).read_text().splitlines()]
    assert {line["partition"] for line in lines} == {"train", "val"} and len(lines) == N + 1
    assert all((line["reference_steps"], line["steps_computed"]) == (2, 1) for line in lines), lines


def test_eval_only_driver_and_report_from_the_server(stack: dict, tmp_path: Path) -> None:
    from calcx.trainer.run.evaluation import collect_eval, run_validation
    from calcx.trainer.run.report import write_report

    cfg = _config(stack, tmp_path / "report")
    counts = asyncio.run(run_validation(cfg, stack["rows"], step=7))
    assert counts == {"sessions": 3, "succeeded": 2, "incomplete": 1}
    collection = collect_eval(stack["services"].server_url, stack["services"].key)
    assert collection.step == 7
    by_source = {(r["row_id"], r["reward"]) for r in collection.records}
    good, wrong, broken = stack["rows"]
    assert by_source == {(good["id"], 1.0), (wrong["id"], 0.0)}
    assert [u["row_id"] for u in collection.unscored] == [broken["id"]]
    out = tmp_path / "out"
    write_report(
        out,
        metrics_path=out / "absent.jsonl",
        eval_records=collection.records,
        allow_no_reward=True,
        eval_note=collection.note(),
    )
    assert (out / "reward_curve.png").read_bytes()[:4] == b"\x89PNG"
    table = (out / "eval.md").read_text()
    assert "| **all** | 2 | 1 | 50.0% |" in table and "1 not scored (FAILED 1)" in table


def test_services_run_the_agent_under_its_own_python_and_path(stack: dict) -> None:
    flags = ServicesConfig(
        workdir=Path("/nonexistent"),
        services_python=sys.executable,
        services_pythonpath=["/a"],
        agent_python=SERVICES_PYTHON,
        agent_pythonpath=["/src", "/site/agent"],
    ).agent_commands()
    assert json.loads(flags[flags.index("--agent-cmd") + 1]) == [
        "env",
        "PYTHONPATH=/src:/site/agent",
        SERVICES_PYTHON,
        "-m",
        "calcx.agent",
    ]
    assert json.loads(flags[flags.index("--worker-cmd") + 1])[-1] == "calcx.worker"
    log = (stack["services"].workdir / "controller.log").read_text()
    assert "runner local" in log
    assert (stack["services"].workdir / "calcx.db").exists()
    assert stack["services"].key.startswith("calcx-run-") and len(stack["services"].key) > 40


def test_rollouts_are_sampled_as_the_trainer_says(stack: dict, tmp_path: Path) -> None:
    """Train rollouts carry rollout.{temperature, top_p, top_k}, validation rollouts val_kwargs'
    (greedy by default), and the gateway sends those values with every model call."""
    from calcx.trainer.run.evaluation import run_validation

    cfg = _config(
        stack,
        tmp_path / "report",
        "actor_rollout_ref.rollout.temperature=0.8",
        "actor_rollout_ref.rollout.top_p=0.95",
        "actor_rollout_ref.rollout.top_k=40",
    )
    good = stack["rows"][0]

    async def scenario():
        await _register(stack, "calcx-stub")
        sessions = await _group(cfg, good, "uid-sampling", 2)
        # step 5: below the eval test's step 7, which reads back the last validation step
        counts = await run_validation(cfg, [good], step=5)
        return sessions, counts

    sessions, counts = asyncio.run(scenario())
    assert all(isinstance(s, list) and s for s in sessions), sessions
    assert counts == {"sessions": 1, "succeeded": 1, "incomplete": 0}
    rollouts = asyncio.run(stack_rollouts(stack))
    train = {"temperature": 0.8, "top_p": 0.95, "top_k": 40}
    greedy = {"temperature": 0.0, "top_p": 1.0, "top_k": 0}
    val_ids = [rid for rid in rollouts if rid.startswith("calcx-val-s5-")]
    assert len(val_ids) == 1
    for rid, expected in [*((f"calcx-train-s2-uid-sampling-{i}", train) for i in range(N)), (val_ids[0], greedy)]:
        assert rollouts[rid]["sampling"] == expected, rid
        forwarded = asyncio.run(_forwarded(stack, rid))
        assert len(forwarded) >= 2  # the tool call, then the answer
        assert all({k: r.get(k) for k in expected} == expected for r in forwarded), (rid, forwarded)
