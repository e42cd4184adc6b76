"""The model registry, for trainers: the model's name, its inference endpoints and the policy
version (kept in the store, so it survives a restart)."""

from __future__ import annotations

import time

from fastapi import Request
from fastapi.responses import Response

from calcx.api.models import ModelRegistryUpdate
from calcx.server.auth import server_key
from calcx.server.errors import json_response, read_model
from calcx.server.routing import Router
from calcx.server.state import ServerState

router = Router(audience=server_key)


@router.put("/v1/models")
async def put_models(request: Request, state: ServerState) -> Response:
    body = await read_model(request, ModelRegistryUpdate, state.settings.max_body_bytes)
    registry = {
        "model": body.model,
        "endpoints": body.endpoints,
        "policy_version": body.policy_version,
        "updated_at": time.time(),
    }
    state.db.registry.put(registry)
    state.registry = registry
    return json_response(registry)


@router.get("/v1/models")
async def get_models(request: Request, state: ServerState) -> Response:
    registry = state.registry or {"model": None, "endpoints": [], "policy_version": None, "updated_at": None}
    return json_response(registry)
