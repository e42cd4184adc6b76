"""An incomplete GRPO group never reaches a training batch, decided by verl's own replay buffer.

verl 0.9.1's sync `ReplayBuffer` evicts a `failure` group only when it holds no trajectory at all
(`failure_keys - materializable_uids`); a failed group with some trajectories stays sampleable and
is trained short. So calcx's part of the contract is that when one member of a group cannot be
completed, *every* session raises and none writes a row. This test feeds verl's buffer the way
verl's V1 trainer does: the prompt registered `pending` (`PPOTrainer._submit_batch_to_rollout`),
then `AgentLoopWorkerTQ._run_prompt` running `CalcxAgentLoop` for each session against the real
server, controller (local runner) and stub LLM, then `ReplayBuffer.sample` on the driver's thread
with the refill hook and sampler settings that `PPOTrainer._build_replay_buffer` derives from the
composed calcx config. One member of one group crashes on every attempt (its agent exits 1
before starting): that group must be evicted, counted in
`training/rollout_failure/evicted_samples`, replaced by a fresh prompt, and absent from the batch;
the complete groups are kept whole.

TransferQueue is not in the trainer resolve: `verl_v1_cpu` loads verl's modules over an in-memory
stand-in of its KV interface.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from live_stack import SERVICES_PYTHON, alive, needs_services, stack_rollouts, start_stub
from verl_v1_cpu import load_v1

from calcx.api.client import AsyncCalcxClient
from calcx.trainer.config.compose import ComposeRequest, compose
from calcx.trainer.run.data import verl_records
from calcx.trainer.run.services import CALCX_SRC, LocalServices, ServicesConfig
from calcx.trainer.run_dir.server_key import write_key_file

pytestmark = [needs_services, pytest.mark.timeout(480)]

N = 2
STEP = 1
BATCH = 2
# the member whose agent crashes on every attempt (rollout ids: calcx-{partition}-s{step}-{uid}-{session})
CRASHING = f"calcx-train-s{STEP}-uid-mixed-1"
EVICTED_METRIC = "training/rollout_failure/evicted_samples"


def _crashing_agent_cmd() -> list[str]:
    """The agent command, except for CRASHING's attempts: an agent process that dies at once
    (exit 1, a `crash`: an infrastructure failure the trainer retries, never a reward)."""
    script = (
        f'case "$AGL_OPENAI_BASE_URL" in */rollouts/{CRASHING}/*) '
        'echo "calcx-agent: failure: crash" >&2; exit 1;; esac; exec "$0" -m calcx.agent'
    )
    return ["sh", "-c", script, SERVICES_PYTHON]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    from calcx.data.generator import generate_split

    work = tmp_path_factory.mktemp("replay-buffer")
    rows = generate_split("train", 2, seed=23)
    config = ServicesConfig(
        workdir=work / "services",
        services_python=SERVICES_PYTHON,
        services_pythonpath=[str(CALCX_SRC)],
        agent_python=SERVICES_PYTHON,
        agent_pythonpath=[str(CALCX_SRC)],
        concurrency=8,
        prefork=False,
        controller_args=["--agent-cmd", json.dumps(_crashing_agent_cmd())],
    )
    services = LocalServices(config)
    stub = None
    try:
        services.start()
        stub, stub_url = start_stub(work, rows)
        yield {"rows": rows, "services": services, "stub_url": stub_url}
    finally:
        pids = services.pids() | ({stub.pid} if stub is not None and stub.alive() else set())
        if stub is not None:
            stub.stop()
        services.stop()
        assert not [p for p in pids if alive(p)], "a process outlived the stack"


def _config(stack: dict, report_dir: Path):
    from omegaconf import OmegaConf

    cfg = compose(
        ComposeRequest(
            model="calcx-stub",
            server_url=stack["services"].server_url,
            dotlist=[
                f"calcx.key_file={write_key_file(stack['services'].key)}",
                f"calcx.report_dir={report_dir}",
                "calcx.max_attempts=2",
                "calcx.deadline_s=90",
                "calcx.wait_timeout_s=5",
                "calcx.group_timeout_s=300",
                f"actor_rollout_ref.rollout.n={N}",
                f"data.train_batch_size={BATCH}",
            ],
        )
    )
    OmegaConf.resolve(cfg)  # as verl's TaskRunner does before any worker sees it
    return cfg


def _worker(v1, cfg):
    """verl's AgentLoopWorkerTQ, in this process instead of a Ray actor, with what its `__init__`
    sets that `_run_prompt` reads: the config, the agent loop registry from the config's
    `agent_loop_config_path` (calcx_agent), and no tokenizer or processor (CalcxAgentLoop
    tokenizes nothing; rows are text-only)."""
    from omegaconf import ListConfig, OmegaConf
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    entries = OmegaConf.load(cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path)
    assert isinstance(entries, ListConfig)  # agent_loop_config_path holds a list of agent loops
    for entry in entries:
        _agent_loop_registry[entry.name] = entry
    worker = object.__new__(v1.agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__)
    worker.config = cfg
    worker.llm_client = None
    worker.teacher_client = None
    worker.reward_loop_worker_handles = None
    worker.tokenizer = worker.processor = None
    worker.hf_model_type = None
    worker.dataset_cls = None
    worker.mm_processor_kwargs = {}
    worker.distillation_enabled = False
    worker.tools = []
    worker.background_tasks = set()
    return worker


def _sync_replay_buffer(v1, cfg, refill):
    """What `PPOTrainer._build_replay_buffer` builds for calcx's config (sync mode, no DAPO filter),
    with the poll interval calcx's task runner sets (`calcx.replay_poll_s`)."""
    from calcx.trainer.workers.task_runner import set_replay_poll

    sampler = cfg.trainer.v1.sampler
    assert cfg.trainer.v1.trainer_mode == "sync"
    assert not (cfg.algorithm.get("filter_groups") or {}).get("enable", False)
    refill_failed = bool(sampler.get("sync_refill_failed_groups", False))
    buffer = v1.replay_buffer.ReplayBuffer(
        trainer_mode="sync",
        trainer_config=cfg.trainer.v1.get("sync", {}),
        max_off_policy_threshold=sampler.max_off_policy_threshold,
        max_off_policy_strategy=sampler.max_off_policy_strategy,
        sampler_kwargs=sampler.sampler_kwargs,
        refill_fn=refill,
        filter_groups_metric=None,
        sync_refill_failed_groups=refill_failed,
        train_batch_size=cfg.data.train_batch_size,
        gen_batch_size=1 if refill_failed else (cfg.data.get("gen_batch_size") or cfg.data.train_batch_size),
        max_inflight_gen_batches=1,
    )
    set_replay_poll(buffer, cfg.calcx.replay_poll_s)
    assert buffer.poll_interval == 0.2
    return buffer


async def _register(stack: dict) -> None:
    client = AsyncCalcxClient(stack["services"].server_url, stack["services"].key)
    try:
        await client.put_models("calcx-stub", [stack["stub_url"]], 0)
    finally:
        await client.aclose()


def test_incomplete_group_is_evicted_counted_and_refilled(stack: dict, tmp_path: Path) -> None:
    v1 = load_v1()
    kv = v1.kv
    kv.reset()
    cfg = _config(stack, tmp_path / "report")
    good, other = stack["rows"]
    rollout = cfg.actor_rollout_ref.rollout
    sampling = {
        "temperature": float(rollout.temperature),
        "top_p": float(rollout.top_p),
        "top_k": int(rollout.top_k),
        "repetition_penalty": 1.0,
        "logprobs": bool(rollout.calculate_log_probs),
    }
    worker = _worker(v1, cfg)
    rows_by_uid: dict[str, dict[str, Any]] = {}
    refills: list[int] = []

    async def scenario():
        loop = asyncio.get_running_loop()
        runs = []

        def submit(uid: str, row: dict[str, Any]) -> None:
            # PPOTrainer._submit_batch_to_rollout (sync): the prompt's tag, then the agent loop worker
            rows_by_uid[uid] = row
            kv.kv_batch_put(
                keys=[uid], partition_id="train", tags=[{"is_prompt": True, "status": "pending", "global_steps": STEP}]
            )
            prompt = {**verl_records([row])[0], "uid": uid, "global_steps": STEP, "index": len(rows_by_uid)}
            trajectory = {"step": STEP, "sample_index": prompt["index"], "rollout_n": 0, "validate": False}
            runs.append(asyncio.run_coroutine_threadsafe(worker._run_prompt(prompt, dict(sampling), trajectory), loop))

        def refill(count: int) -> int:  # PPOTrainer._add_prompts_to_generate, on the sampler's thread
            refills.append(count)
            for i in range(count):
                submit(f"uid-refill{len(refills)}x{i}", other)
            return count

        await _register(stack)
        buffer = _sync_replay_buffer(v1, cfg, refill)
        submit("uid-good", good)
        submit("uid-mixed", good)
        sampled = await asyncio.wait_for(
            asyncio.to_thread(buffer.sample, global_steps=STEP, partition_id="train", batch_size=BATCH), 400
        )
        await asyncio.gather(*(asyncio.wrap_future(r) for r in runs))
        return sampled

    batch, metrics = asyncio.run(scenario())
    rollouts = asyncio.run(stack_rollouts(stack))

    # the crashing member was retried as a new attempt, then given up: FAILED, never a reward
    crashed = rollouts[CRASHING]
    assert crashed["state"] == "FAILED" and crashed["reward"] is None
    assert [a["reason"] for a in crashed["attempts"]] == ["crash", "crash"]
    assert rollouts["calcx-train-s1-uid-mixed-0"]["state"] == "SUCCEEDED"  # its sibling finished fine

    # verl evicted the incomplete group, counted it, asked for exactly one fresh prompt
    assert metrics.get(EVICTED_METRIC) == 1, metrics
    assert refills == [1]
    refilled = "uid-refill1x0"
    uids = {key.split("_")[0] for key in batch.keys}
    assert uids == {"uid-good", refilled}, batch.keys
    assert "uid-mixed" not in kv.kv_list("train")["train"]
    assert not [k for k in kv.kv_list("train")["train"] if k.startswith("uid-mixed")]

    # the kept groups are whole: every session's every recorded call, each with its rollout's reward
    for uid in ("uid-good", refilled):
        keys = [k for k in batch.keys if k.startswith(uid + "_")]
        assert {k.split("_")[1] for k in keys} == {str(s) for s in range(N)}
        for key in keys:
            row = kv.values("train", key)
            assert float(row["rm_scores"].sum()) == 1.0
            assert int(row["response_mask"].sum()) == row["responses"].numel() > 0
        for session in range(N):
            member = rollouts[f"calcx-train-s{STEP}-{uid}-{session}"]
            assert member["state"] == "SUCCEEDED" and member["reward"] == 1.0
    assert all(tag["status"] == "success" for tag in batch.tags)

    # every session of the incomplete group said why, once
    lines = [json.loads(x) for x in (tmp_path / "report" / "incomplete_groups.jsonl").read_text().splitlines()]
    assert sorted(x["rollout_id"] for x in lines) == [f"calcx-train-s{STEP}-uid-mixed-{s}" for s in range(N)]
    assert {x["uid"] for x in lines} == {"uid-mixed"}
