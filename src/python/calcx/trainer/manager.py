"""verl AgentLoopManager that registers the vLLM replicas with the calcx server first.

Selected by `actor_rollout_ref.rollout.agent.agent_loop_manager_class`; verl's V1 TaskRunner
creates it once the replicas are up and before any prompt is dispatched. The replicas' addresses
come from verl's global load balancer (`get_all_servers`, "host:port" per replica).
"""

from __future__ import annotations

import ray
from verl.trainer.ppo.v1 import AgentLoopManagerTQ
from verl.utils.ray_utils import auto_await

from calcx.trainer.replicas import register_replicas_async


def replica_addresses(llm_client) -> list[str]:
    balancer = getattr(llm_client, "_load_balancer", None)
    if balancer is None:
        raise RuntimeError("verl's LLM client exposes no load balancer; cannot find the vLLM replica addresses")
    return list(ray.get(balancer.get_all_servers.remote()))


class CalcxAgentLoopManager(AgentLoopManagerTQ):
    @classmethod
    @auto_await
    async def create(cls, *args, **kwargs):
        instance = cls(*args, **kwargs)
        calcx = instance.config.calcx
        await register_replicas_async(
            str(calcx.server_url), str(calcx.key or ""), str(instance.config.actor_rollout_ref.model.path),
            replica_addresses(instance.llm_client), policy_version=0,
        )
        await instance._init_agent_loop_workers()
        return instance
