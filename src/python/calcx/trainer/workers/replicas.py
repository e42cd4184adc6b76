"""Tell the calcx server where the policy's vLLM replicas listen (PUT /v1/models)."""

from __future__ import annotations

from collections.abc import Iterable

from calcx.api.client import AsyncCalcxClient, CalcxClient


def openai_endpoints(addresses: Iterable[str]) -> list[str]:
    """verl's replica addresses ("host:port", "[v6]:port") -> OpenAI base URLs, in order, no repeats."""
    endpoints: list[str] = []
    for address in addresses:
        address = address.strip()
        if not address:
            continue
        if "://" not in address:
            address = f"http://{address}"
        url = address.rstrip("/")
        if not url.endswith("/v1"):
            url += "/v1"
        if url not in endpoints:
            endpoints.append(url)
    if not endpoints:
        raise ValueError("no vLLM replica address to register: verl reported none")
    return endpoints


async def register_replicas_async(
    server_url: str, key: str, model: str, addresses: Iterable[str], policy_version: int = 0
) -> dict:
    client = AsyncCalcxClient(server_url, key)
    try:
        registry = await client.put_models(model, openai_endpoints(addresses), policy_version)
        return registry.model_dump(mode="json")
    finally:
        await client.aclose()


def register_replicas(server_url: str, key: str, model: str, addresses: Iterable[str], policy_version: int = 0) -> dict:
    """Blocking form (no event loop needed, so it runs on any thread): the trainer's driver before
    rollouts start and after each weight sync."""
    with CalcxClient(server_url, key) as client:
        return client.put_models(model, openai_endpoints(addresses), policy_version).model_dump(mode="json")
