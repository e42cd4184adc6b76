"""verl AgentLoopManager that registers the vLLM replicas with the calcx server first.

Selected by `actor_rollout_ref.rollout.agent.agent_loop_manager_class`; verl's V1 TaskRunner
creates it once the replicas are up and before any prompt is dispatched. The replicas' addresses
come from verl's global load balancer (`get_all_servers`, "host:port" per replica). After each
weight sync the trainer's task runner (calcx.trainer.workers.task_runner) has it publish the policy
version the replicas now serve, so the gateway records that version on every call.
"""

from __future__ import annotations

import ray
from verl.trainer.ppo.v1 import AgentLoopManagerTQ
from verl.utils.ray_utils import auto_await

from calcx.trainer.run_dir.server_key import server_key
from calcx.trainer.workers.replicas import register_replicas, register_replicas_async


def replica_addresses(llm_client) -> list[str]:
    balancer = getattr(llm_client, "_load_balancer", None)
    if balancer is None:
        raise RuntimeError("verl's LLM client exposes no load balancer; cannot find the vLLM replica addresses")
    return list(ray.get(balancer.get_all_servers.remote()))


class CalcxAgentLoopManager(AgentLoopManagerTQ):
    calcx_registration: tuple[str, str, str, list[str]]  # server URL, key, model, replica addresses

    @classmethod
    @auto_await
    async def create(cls, *args, **kwargs):
        instance = cls(*args, **kwargs)
        calcx = instance.config.calcx
        instance.calcx_registration = (
            str(calcx.server_url),
            server_key(calcx),
            str(instance.config.actor_rollout_ref.model.path),
            replica_addresses(instance.llm_client),
        )
        server_url, key, model, addresses = instance.calcx_registration
        await register_replicas_async(server_url, key, model, addresses, policy_version=0)
        await instance._init_agent_loop_workers()
        return instance

    def publish_policy_version(self, version: int) -> None:
        """Tell the server which policy version the replicas serve from now on (same model and
        endpoints); called from the trainer's driver thread right after a weight sync."""
        server_url, key, model, addresses = self.calcx_registration
        register_replicas(server_url, key, model, addresses, policy_version=int(version))
