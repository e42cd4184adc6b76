"""`calcx train --gpus N --nnodes M`: the composed config on N GPUs of M nodes, verl's own checks
on it, and the rule for the batch, refused by name where it does not split."""

from __future__ import annotations

import pytest
from omegaconf import DictConfig, OmegaConf

from calcx.trainer.config.compose import ComposeRequest, ConfigError, compose
from calcx.trainer.config.scale import (
    RAY_ADDRESS_ENV,
    ScaleError,
    ray_cluster_address,
    scale_of,
    services_host,
)

#: the reference batch every comparison keeps: 32 prompts x 4 samples, one mini-batch a step
REFERENCE_SAMPLES = 32 * 4


def _compose(**kwargs) -> DictConfig:
    return compose(ComposeRequest(gpu_memory_gib=0, **kwargs))


def test_one_gpu_of_one_node_is_the_config_without_the_flags() -> None:
    assert OmegaConf.to_yaml(_compose(gpus_per_node=1, nnodes=1)) == OmegaConf.to_yaml(_compose())


@pytest.mark.parametrize(("gpus", "nodes"), [(1, 1), (2, 1), (8, 1), (8, 2)])
def test_n_gpus_compose_to_n_replicas_fsdp_over_all_and_the_same_batch(gpus: int, nodes: int) -> None:
    from calcx.trainer.run.launch import validate_with_verl

    cfg = _compose(gpus_per_node=gpus, nnodes=nodes)
    assert (cfg.trainer.n_gpus_per_node, cfg.trainer.nnodes) == (gpus, nodes)
    arr = cfg.actor_rollout_ref
    assert arr.rollout.tensor_model_parallel_size == 1  # a 1.5B model: one vLLM replica a GPU
    assert arr.actor.fsdp_config.fsdp_size == -1  # FSDP shards over every GPU of the run
    # the batch is the reference whatever the GPUs: the same 128 samples a step, one mini-batch
    assert (cfg.data.train_batch_size, arr.rollout.n, arr.actor.ppo_mini_batch_size) == (32, 4, 32)
    # the token budgets are per GPU (its memory), not per run: unchanged
    assert arr.actor.ppo_max_token_len_per_gpu == _compose().actor_rollout_ref.actor.ppo_max_token_len_per_gpu
    scale = scale_of(cfg)
    assert scale.rollout_replicas == gpus * nodes and scale.data_parallel == gpus * nodes
    assert scale.mini_batch_samples_per_gpu * gpus * nodes == REFERENCE_SAMPLES
    validate_with_verl(cfg)  # verl's validate_config and dataclass conversions, on CPU


@pytest.mark.parametrize("gpus", [2, 8])
def test_fixed_micro_batches_pass_verls_own_divisibility_check_too(gpus: int) -> None:
    """With micro-batches cut by rows (not tokens), verl's validate_config checks the step's
    samples against the GPUs itself; the composed N-GPU config passes it."""
    from calcx.trainer.run.launch import validate_with_verl

    validate_with_verl(_compose(gpus_per_node=gpus, dotlist=["actor_rollout_ref.actor.use_dynamic_bsz=false"]))


@pytest.mark.parametrize("gpus", [3, 5, 6, 12])
def test_a_gpu_count_the_batch_does_not_split_over_is_refused_naming_the_rule(gpus: int) -> None:
    with pytest.raises(ConfigError, match=r"128 samples .*ppo_mini_batch_size x actor_rollout_ref.rollout.n.*"):
        _compose(gpus_per_node=gpus)
    # the rule is verl's: its own check (which it skips under token-cut micro-batches) refuses it too
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    cfg = _compose(dotlist=["actor_rollout_ref.actor.use_dynamic_bsz=false"])
    cfg.trainer.n_gpus_per_node = gpus
    with pytest.raises(AssertionError, match="must be divisible"):
        validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))


def test_the_rule_follows_the_mini_batch_not_the_gpu_count() -> None:
    scale_of(_compose(gpus_per_node=8, dotlist=["actor_rollout_ref.actor.ppo_mini_batch_size=2"]))  # 8 over 8
    with pytest.raises(ConfigError, match="4 samples .* 8 data-parallel GPUs"):
        _compose(gpus_per_node=8, dotlist=["actor_rollout_ref.actor.ppo_mini_batch_size=1"])


@pytest.mark.parametrize(
    "request_kwargs",
    [
        {"gpus_per_node": 0},
        {"nnodes": 0},
        {"dotlist": ["trainer.n_gpus_per_node=-2"]},
        {"dotlist": ["trainer.nnodes=1.5"]},
    ],
)
def test_fewer_than_one_gpu_or_node_is_refused(request_kwargs) -> None:
    with pytest.raises(ConfigError, match=r"trainer\.(n_gpus_per_node|nnodes)=.* must be a whole number >= 1"):
        _compose(**request_kwargs)


def test_a_replica_larger_than_a_node_share_is_refused() -> None:
    with pytest.raises(ConfigError, match="not a multiple of one vLLM replica's GPUs"):
        _compose(gpus_per_node=3, dotlist=["actor_rollout_ref.rollout.tensor_model_parallel_size=2"])
    two = _compose(gpus_per_node=8, dotlist=["actor_rollout_ref.rollout.tensor_model_parallel_size=2"])
    assert scale_of(two).rollout_replicas == 4


def test_vllms_in_process_worker_is_refused_for_a_replica_of_several_gpus() -> None:
    uni = "actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend=uni"
    with pytest.raises(ConfigError, match="=uni runs a vLLM replica's one GPU worker .* has 2 GPUs"):
        _compose(gpus_per_node=2, dotlist=[uni, "actor_rollout_ref.rollout.tensor_model_parallel_size=2"])
    assert scale_of(_compose(gpus_per_node=2, dotlist=[uni])).rollout_replicas == 2


def test_the_ray_address_comes_from_the_flag_else_ray_job_submit() -> None:
    flagged = _compose(gpus_per_node=8, nnodes=2, ray_address="head:6379")
    assert flagged.ray_kwargs.ray_init.address == "head:6379"
    assert ray_cluster_address(flagged, {RAY_ADDRESS_ENV: "other:6379"}) == "head:6379"
    assert ray_cluster_address(_compose(), {RAY_ADDRESS_ENV: "http://10.0.0.2:8265"}) == "http://10.0.0.2:8265"
    assert ray_cluster_address(_compose(), {}) is None


def test_several_nodes_without_a_ray_cluster_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from calcx.trainer.run.launch import LaunchError, ray_cluster

    monkeypatch.delenv(RAY_ADDRESS_ENV, raising=False)
    with pytest.raises(LaunchError, match="trainer.nnodes=2: .*--ray-address"):
        ray_cluster(_compose(gpus_per_node=8, nnodes=2))
    assert ray_cluster(_compose(gpus_per_node=8)) is None
    monkeypatch.setenv(RAY_ADDRESS_ENV, "http://head:8265")
    assert ray_cluster(_compose(gpus_per_node=8, nnodes=2)) == "http://head:8265"


def test_the_started_server_listens_where_every_node_reaches_it() -> None:
    assert services_host({}, None) == "127.0.0.1"  # one machine: loopback, as before
    assert services_host({"services_host": "10.0.0.1"}, "head:6379") == "10.0.0.1"
    for loopback in ("127.0.0.1", "localhost"):
        with pytest.raises(ScaleError, match="--services-host"):
            services_host({"services_host": loopback}, "head:6379")
    with pytest.raises(ScaleError, match="no address"):
        services_host({"services_host": "0.0.0.0"}, None)
    cfg = _compose(services_host="10.0.0.1")
    assert services_host(cfg.calcx, "head:6379") == "10.0.0.1"
