"""How a run spreads over GPUs and nodes: verl's `trainer.n_gpus_per_node` x `trainer.nnodes`,
checked against the batch and the rollout replicas when the config is composed.

verl 0.9.1 cuts micro-batches by tokens here (`use_dynamic_bsz`), and then its own
`validate_config` skips the divisibility checks; the engine worker still asserts that a
mini-batch's samples split evenly over the data-parallel ranks, but only at the first update,
minutes after vLLM started. These rules fail the composition instead, naming the rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

GPUS_KEY = "trainer.n_gpus_per_node"
NODES_KEY = "trainer.nnodes"
#: where `--ray-address` goes: verl hands `ray_kwargs.ray_init` to `ray.init` as keyword arguments
RAY_ADDRESS_KEY = "ray_kwargs.ray_init.address"
#: what `ray job submit` sets for the job's driver, and what `ray.init()` reads without an address
RAY_ADDRESS_ENV = "RAY_ADDRESS"
#: the key of the `calcx` section that holds the address the server `calcx train` starts listens on
SERVICES_HOST = "services_host"
SERVICES_HOST_KEY = f"calcx.{SERVICES_HOST}"
#: what verl 0.9.1's FSDP engine divides the world by for its data-parallel size
SP_KEY = "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size"
#: vLLM's executor: `uni` (the GPU worker in the engine core's process) holds one GPU a replica
VLLM_BACKEND_KEY = "actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend"
LOOPBACK = "127.0.0.1"
WILDCARDS = ("0.0.0.0", "::", "")


class ScaleError(ValueError):
    """A GPU count, node count or batch size that cannot be spread as configured; names the rule."""


@dataclass(frozen=True)
class Scale:
    """The run's GPUs and what verl makes of them."""

    gpus_per_node: int
    nnodes: int
    rollout_gpus: int  # GPUs of one vLLM replica: tensor x data x pipeline parallel size
    sequence_parallel: int  # Ulysses sequence-parallel size of the actor's FSDP engine
    mini_batch_samples: int  # ppo_mini_batch_size x rollout.n

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nnodes

    @property
    def rollout_replicas(self) -> int:
        """vLLM servers verl starts (world size // replica size), each registered with the gateway."""
        return self.gpus // self.rollout_gpus

    @property
    def data_parallel(self) -> int:
        """FSDP's data-parallel ranks (verl shards over every GPU: `fsdp_size` -1)."""
        return self.gpus // self.sequence_parallel

    @property
    def mini_batch_samples_per_gpu(self) -> int:
        return self.mini_batch_samples // self.data_parallel


def _positive(cfg: DictConfig, dotted: str) -> int:
    value = OmegaConf.select(cfg, dotted)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ScaleError(f"{dotted}={value!r} must be a whole number >= 1")
    return value


def scale_of(cfg: DictConfig) -> Scale:
    """The checked scale of a composed config; ScaleError names the rule a value breaks."""
    gpus_per_node = _positive(cfg, GPUS_KEY)
    nnodes = _positive(cfg, NODES_KEY)
    replica = 1
    for key in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size"):
        replica *= _positive(cfg, f"actor_rollout_ref.rollout.{key}")
    if gpus_per_node % replica:
        raise ScaleError(
            f"{GPUS_KEY}={gpus_per_node} is not a multiple of one vLLM replica's GPUs ({replica}: "
            "actor_rollout_ref.rollout tensor x data x pipeline parallel size); every replica must fit "
            "on one node and every GPU hold a replica"
        )
    backend = OmegaConf.select(cfg, VLLM_BACKEND_KEY, default=None)
    if backend == "uni" and replica > 1:
        raise ScaleError(
            f"{VLLM_BACKEND_KEY}=uni runs a vLLM replica's one GPU worker in the engine's process, but a "
            f"replica here has {replica} GPUs (actor_rollout_ref.rollout tensor x data x pipeline parallel "
            "size); use mp, or replicas of one GPU"
        )
    sp = _positive(cfg, SP_KEY)
    scale = Scale(
        gpus_per_node=gpus_per_node,
        nnodes=nnodes,
        rollout_gpus=replica,
        sequence_parallel=sp,
        mini_batch_samples=_positive(cfg, "actor_rollout_ref.actor.ppo_mini_batch_size")
        * _positive(cfg, "actor_rollout_ref.rollout.n"),
    )
    if scale.gpus % sp:
        raise ScaleError(f"{scale.gpus} GPUs ({GPUS_KEY} x {NODES_KEY}) is not a multiple of " f"{SP_KEY}={sp}")
    if scale.mini_batch_samples % scale.data_parallel:
        raise ScaleError(
            f"a mini-batch of {scale.mini_batch_samples} samples (actor_rollout_ref.actor.ppo_mini_batch_size x "
            f"actor_rollout_ref.rollout.n) does not split evenly over {scale.data_parallel} data-parallel GPUs "
            f"({GPUS_KEY} x {NODES_KEY} / ulysses_sequence_parallel_size); use a GPU count that divides "
            f"{scale.mini_batch_samples}, or a mini-batch whose samples it divides"
        )
    return scale


def ray_cluster_address(cfg: DictConfig, environ: Mapping[str, str]) -> str | None:
    """The Ray cluster a run joins (`--ray-address`, else `ray job submit`'s RAY_ADDRESS); None:
    verl starts a Ray of its own on this machine."""
    value = OmegaConf.select(cfg, RAY_ADDRESS_KEY, default=None) or environ.get(RAY_ADDRESS_ENV) or None
    return None if value is None else str(value)


def services_host(calcx: Any, cluster: str | None) -> str:
    """Where the server `calcx train` starts listens and is reached (`calcx.services_host`). On a
    Ray cluster, Ray workers on other nodes create its rollouts: loopback reaches none of them, and a
    wildcard is no address to hand them."""
    host = str(calcx.get(SERVICES_HOST) or LOOPBACK)
    if host in WILDCARDS:
        raise ScaleError(
            f"{SERVICES_HOST_KEY}={host!r} is no address to reach the server at; give this node's address "
            "that every Ray node reaches"
        )
    if cluster is not None and (host == "localhost" or host.startswith("127.") or host == "::1"):
        raise ScaleError(
            f"on a Ray cluster ({cluster}) the Ray workers of other nodes must reach the calcx server, "
            f"and {host} is this machine alone: pass --services-host with this node's address (every node "
            "must reach it), or --agl-base-url of a server they reach"
        )
    return host
