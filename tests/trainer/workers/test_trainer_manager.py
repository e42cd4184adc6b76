"""`CalcxAgentLoopManager.create` registers verl's replicas with a real calcx server before any
agent loop worker starts, and fails with a message that says what is wrong when it cannot.

verl's side is real and runs on CPU: a local Ray instance, verl's global load balancer actor
(`get_router_handle`, the registry `replica_addresses` reads) holding the stub LLM's address as
verl reports a vLLM replica ("host:port"), verl's `LLMServerClient`, and verl's
`AgentLoopManagerTQ` underneath (`rollout.agent.num_workers=0`: no worker needs a model). The
calcx side is the real server, controller (local runner) and agent: once registered, a rollout
goes through the gateway to that replica and is recorded with its endpoint.

TransferQueue is not in the trainer resolve: `verl_v1_cpu` loads verl's V1 modules over an
in-memory stand-in of its KV interface (nothing here stores anything in it).
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from live_stack import SERVICES_PYTHON, alive, needs_services, start_stub
from verl_v1_cpu import load_v1

from calcx.api.client import AsyncCalcxClient, CalcxAPIError
from calcx.trainer.config.compose import ComposeRequest, compose
from calcx.trainer.rollouts.rollout_request import rollout_create_body
from calcx.trainer.run.services import CALCX_SRC, LocalServices, ServicesConfig
from calcx.trainer.run_dir.server_key import write_key_file
from calcx.trainer.workers.replicas import register_replicas_async

pytestmark = [needs_services, pytest.mark.timeout(480)]
MODEL = "calcx-stub"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    import ray

    from calcx.data.generator import generate_split

    work = tmp_path_factory.mktemp("manager")
    rows = generate_split("train", 1, seed=5)
    config = ServicesConfig(
        workdir=work / "services",
        services_python=SERVICES_PYTHON,
        services_pythonpath=[str(CALCX_SRC)],
        agent_python=SERVICES_PYTHON,
        agent_pythonpath=[str(CALCX_SRC)],
        concurrency=2,
    )
    services = LocalServices(config)
    stub = None
    try:
        services.start()
        stub, stub_url = start_stub(work, rows)
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
        yield {"rows": rows, "services": services, "stub_url": stub_url, "v1": load_v1()}
    finally:
        if ray.is_initialized():
            ray.shutdown()
        pids = services.pids() | ({stub.pid} if stub is not None and stub.alive() else set())
        if stub is not None:
            stub.stop()
        services.stop()
        assert not [p for p in pids if alive(p)], "a process outlived the stack"


def _config(server_url: str, key: str, tmp_path: Path, workers: int = 0):
    """calcx's composed config; `workers` agent loop workers (each would need a model to start)."""
    from omegaconf import OmegaConf

    cfg = compose(
        ComposeRequest(
            model=MODEL,
            server_url=server_url,
            dotlist=[
                f"calcx.key_file={write_key_file(key)}",
                f"calcx.report_dir={tmp_path / 'report'}",
                f"actor_rollout_ref.rollout.agent.num_workers={workers}",
            ],
        )
    )
    OmegaConf.resolve(cfg)
    return cfg


def _llm_client(cfg, addresses: list[str]):
    """verl's LLM client over verl's load balancer actor, as LLMServerManager hands it to the
    agent loop manager (the replica handles are not called here)."""
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import get_router_handle

    return LLMServerClient(config=cfg, load_balancer_handle=get_router_handle(servers=dict.fromkeys(addresses)))


def _create(cfg, llm_client):
    from calcx.trainer.workers.manager import CalcxAgentLoopManager

    return CalcxAgentLoopManager.create(config=cfg, llm_client=llm_client)


def _registry(stack: dict) -> dict:
    services = stack["services"]
    response = httpx.get(
        f"{services.server_url}/v1/models", headers={"Authorization": f"Bearer {services.key}"}, timeout=10
    )
    response.raise_for_status()
    return response.json()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _one_rollout(stack: dict, rid: str) -> tuple[dict, list[dict]]:
    services = stack["services"]
    client = AsyncCalcxClient(services.server_url, services.key)
    try:
        await client.create_rollouts(
            [
                rollout_create_body(
                    rollout_id=rid,
                    group_id=rid,
                    row=stack["rows"][0],
                    policy_version=0,
                    env_map={"QUESTION": "question", "RESULT": "result"},
                    deadline_s=90,
                    max_attempts=1,
                    labels={},
                )
            ]
        )
        for _ in range(12):
            rollout = (await client.wait(rid, timeout_s=10)).model_dump(mode="json")
            if rollout["state"] in ("SUCCEEDED", "FAILED"):
                return rollout, [c.model_dump(mode="json") for c in await client.calls(rid)]
        raise AssertionError(f"{rid} did not finish: {rollout}")
    finally:
        await client.aclose()


def test_create_registers_verl_replicas_and_the_gateway_uses_them(stack: dict, tmp_path: Path) -> None:
    services = stack["services"]
    replica = stack["stub_url"].removeprefix("http://").removesuffix("/v1")  # "127.0.0.1:PORT", as verl says
    cfg = _config(services.server_url, services.key, tmp_path)

    manager = _create(cfg, _llm_client(cfg, [replica]))

    assert type(manager).__mro__[1] is stack["v1"].agent_loop_tq.AgentLoopManagerTQ
    assert manager.agent_loop_workers == []  # verl's worker start ran after the registration
    registry = _registry(stack)
    assert registry["model"] == MODEL == cfg.actor_rollout_ref.model.path
    assert registry["endpoints"] == [f"http://{replica}/v1"] and registry["policy_version"] == 0

    # the gateway forwards an agent's calls to the registered replica and records where they went
    rollout, calls = asyncio.run(_one_rollout(stack, "manager-e2e"))
    assert rollout["state"] == "SUCCEEDED" and rollout["reward"] == 1.0, rollout
    assert len(calls) >= 2 and {c["endpoint"] for c in calls} == {f"http://{replica}/v1"}
    assert all(c["status_code"] == 200 and c["response_token_ids"] for c in calls)


def test_create_fails_clearly_when_the_server_is_down(stack: dict, tmp_path: Path) -> None:
    import ray

    url = f"http://127.0.0.1:{_free_port()}"
    cfg = _config(url, stack["services"].key, tmp_path, workers=1)
    with pytest.raises(CalcxAPIError) as err:
        _create(cfg, _llm_client(cfg, ["127.0.0.1:9"]))
    assert err.value.status == 0 and err.value.code == "unreachable"
    assert f"PUT {url}/v1/models" in str(err.value) and "ConnectError" in str(err.value)
    # no agent loop worker was started for replicas the server does not know
    assert not [
        a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("agent_loop_worker_")
    ]


@pytest.mark.parametrize("key", ["calcx-run-wrong", ""])
def test_create_fails_clearly_with_a_wrong_or_missing_key(stack: dict, tmp_path: Path, key: str) -> None:
    before = _registry(stack)
    cfg = _config(stack["services"].server_url, key, tmp_path)
    with pytest.raises(CalcxAPIError) as err:
        _create(cfg, _llm_client(cfg, ["127.0.0.1:9"]))
    assert err.value.status == 401 and err.value.code == "unauthorized", err.value
    assert str(err.value).startswith("calcx server: 401 unauthorized: ")
    assert _registry(stack) == before  # a refused registration changes nothing


def test_create_fails_clearly_without_replicas(stack: dict, tmp_path: Path) -> None:
    from verl.workers.rollout.llm_server import LLMServerClient

    cfg = _config(stack["services"].server_url, stack["services"].key, tmp_path)
    with pytest.raises(ValueError, match="no vLLM replica address to register: verl reported none"):
        _create(cfg, _llm_client(cfg, []))
    with pytest.raises(RuntimeError, match="exposes no load balancer"):
        _create(cfg, LLMServerClient(config=cfg, load_balancer_handle=None))


class _ActorGroup:
    """The training side of verl's colocated ("naive") weight sync: the actor workers' RPC, which
    would load the new weights into the co-located vLLM (nothing to load here)."""

    def __init__(self) -> None:
        self.synced: list[int | None] = []

    def update_weights(self, global_steps: int | None = None, mode: str = "") -> list:
        self.synced.append(global_steps)
        return []  # the object refs verl waits for


class _Replica:
    """A rollout replica as verl's CheckpointEngineManager drives it; on `resume_generation` it reads
    the version the calcx server would stamp on the first call that reaches the new weights."""

    def __init__(self, stack: dict) -> None:
        self.stack = stack
        self.versions_at_resume: list[int] = []

    async def resume_generation(self) -> None:
        self.versions_at_resume.append(_registry(self.stack)["policy_version"])


def test_task_runner_publishes_the_served_policy_version_at_each_weight_sync(stack: dict, tmp_path: Path) -> None:
    """verl's own trainer hooks (sync and colocate_async `on_step_end`) sync weights through verl's
    CheckpointEngineManager; after calcx's task runner has set up the agent loop manager, each sync
    with a step moves the server's policy version to that step before generation resumes, a sync
    without one (validation) leaves it, and the gateway stamps the served version on calls."""
    import importlib
    from types import SimpleNamespace

    from verl.checkpoint_engine import CheckpointEngineManager
    from verl.workers.config.rollout import CheckpointEngineConfig

    from calcx.trainer.workers.task_runner import CalcxTaskRunner, CalcxTaskRunnerBase

    sync = importlib.import_module("verl.trainer.ppo.v1.trainer_sync").PPOTrainerSync
    colocate_async = importlib.import_module("verl.trainer.ppo.v1.trainer_colocate_async").PPOTrainerColocateAsync
    assert CalcxTaskRunner.__ray_metadata__.modified_class.__ray_actor_class__ is CalcxTaskRunnerBase

    services = stack["services"]
    replica_address = stack["stub_url"].removeprefix("http://").removesuffix("/v1")
    cfg = _config(services.server_url, services.key, tmp_path)
    actors, replica = _ActorGroup(), _Replica(stack)
    trainer = SimpleNamespace(
        global_steps=3,
        timing_raw={},
        curr_step_profile=False,  # resumed from a step-3 checkpoint
        checkpoint_manager=CheckpointEngineManager(
            CheckpointEngineConfig(backend="naive"), cast(Any, actors), [cast(Any, replica)]
        ),
        get_llm_client=lambda: _llm_client(cfg, [replica_address]),
        get_teacher_client=lambda: None,
        get_reward_handles=lambda: [],
        replay_buffer=SimpleNamespace(poll_interval=2.0),  # verl's built-in interval
        # what calcx's tool-use metrics, checkpoint marker and training ledger wrap (verl's V1
        # trainer has all four)
        _validate=lambda *args, **kwargs: {},
        _compute_metrics=lambda batch, metrics, *args, **kwargs: None,
        _save_checkpoint=lambda: None,
        step=lambda metrics, timing_raw: None,
    )
    runner = CalcxTaskRunnerBase()
    runner.config, runner.trainer = cfg, trainer

    runner.init_agent_loop_manager()  # verl's runner creates the manager; calcx's publishes
    assert trainer.replay_buffer.poll_interval == cfg.calcx.replay_poll_s == 0.2
    assert _registry(stack)["policy_version"] == 3
    assert _registry(stack)["endpoints"] == [f"http://{replica_address}/v1"]

    trainer.global_steps = 4
    sync.on_step_end(trainer)
    assert _registry(stack)["policy_version"] == 4 and actors.synced == [4]

    trainer.global_steps = 5
    colocate_async.on_step_end(trainer)  # sync, then resume generation: the version is already 5
    assert replica.versions_at_resume == [5] and actors.synced == [4, 5]

    trainer.checkpoint_manager.update_weights()  # validation reloads the same weights: no new version
    assert _registry(stack)["policy_version"] == 5 and actors.synced == [4, 5, None]

    rollout, calls = asyncio.run(_one_rollout(stack, "served-version"))
    assert rollout["state"] == "SUCCEEDED" and rollout["policy_version"] == 0  # what it declared
    assert calls and {c["policy_version"] for c in calls} == {5}  # what served it


def test_replay_poll_must_be_a_positive_number_of_seconds() -> None:
    from types import SimpleNamespace

    from calcx.trainer.workers.task_runner import set_replay_poll

    buffer = SimpleNamespace(poll_interval=2.0)
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="calcx.replay_poll_s must be a positive number"):
            set_replay_poll(buffer, bad)
    set_replay_poll(buffer, None)  # a config without the key keeps verl's interval
    assert buffer.poll_interval == 2.0
    set_replay_poll(buffer, 0.5)
    assert buffer.poll_interval == 0.5


def test_register_replicas_normalises_verl_addresses(stack: dict) -> None:
    services = stack["services"]
    registered = asyncio.run(
        register_replicas_async(
            services.server_url,
            services.key,
            "other-model",
            ["127.0.0.1:8001", " [::1]:8002 ", "http://127.0.0.1:8001/v1/", "", "h:1/v1"],
            policy_version=3,
        )
    )
    expected = ["http://127.0.0.1:8001/v1", "http://[::1]:8002/v1", "http://h:1/v1"]
    assert registered["endpoints"] == expected and registered["policy_version"] == 3
    assert _registry(stack)["endpoints"] == expected and _registry(stack)["model"] == "other-model"


def test_n_gpus_register_one_endpoint_a_replica_with_the_nodes_key(
    stack: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`calcx train --gpus 2` on a Ray cluster: verl starts one vLLM replica a GPU (TP 1) and its load
    balancer lists each; the manager registers every one with the gateway, reading the key from the
    node's CALCX_KEY (the config names no key file there), and the gateway places rollouts on both."""
    from omegaconf import OmegaConf

    from calcx.trainer.config.scale import scale_of

    services = stack["services"]
    # two replicas slow enough that both rollouts are at home when the second one's first call arrives
    stubs = []
    for i in range(2):
        (tmp_path / f"replica-{i}").mkdir()
        stubs.append(start_stub(tmp_path / f"replica-{i}", stack["rows"], "--mode", "slow", "--slow-s", "1.5"))
    try:
        cfg = compose(
            ComposeRequest(
                model=MODEL,
                server_url=services.server_url,
                gpus_per_node=2,
                dotlist=[
                    "+calcx.key_from_env=true",
                    f"calcx.report_dir={tmp_path / 'report'}",
                    "actor_rollout_ref.rollout.agent.num_workers=0",
                ],
            )
        )
        OmegaConf.resolve(cfg)
        assert cfg.calcx.key_file is None
        monkeypatch.setenv("CALCX_KEY", services.key)
        replicas = [url.removeprefix("http://").removesuffix("/v1") for _, url in stubs]
        assert scale_of(cfg).rollout_replicas == len(replicas)

        _create(cfg, _llm_client(cfg, replicas))

        expected = [f"http://{replica}/v1" for replica in replicas]
        assert sorted(_registry(stack)["endpoints"]) == sorted(expected)

        async def both() -> list[tuple[dict, list[dict]]]:
            return await asyncio.gather(*(_one_rollout(stack, f"replicas-{i}") for i in range(2)))

        done = asyncio.run(both())
        assert all(rollout["state"] == "SUCCEEDED" for rollout, _ in done), done
        assert {call["endpoint"] for _, calls in done for call in calls} == set(expected)
    finally:
        for stub, _ in stubs:
            stub.stop()
