"""The model registry, for trainers: the model's name, its inference endpoints and the policy
version (kept in the store, so it survives a restart)."""

from __future__ import annotations

import time

from fastapi import Request
from fastapi.responses import Response

from calcx.api import endpoints as api
from calcx.api.models import ModelRegistryUpdate
from calcx.server.errors import json_response
from calcx.server.routing import Routes
from calcx.server.state import ServerState

routes = Routes()


@routes.serve(api.PUT_MODELS)
async def put_models(request: Request, state: ServerState, body: ModelRegistryUpdate) -> Response:
    registry = {
        "model": body.model,
        "endpoints": body.endpoints,
        "policy_version": body.policy_version,
        "updated_at": time.time(),
    }
    state.db.registry.put(registry)
    state.registry = registry
    return json_response(registry)


@routes.serve(api.GET_MODELS)
async def get_models(request: Request, state: ServerState, body: None) -> Response:
    registry = state.registry or {"model": None, "endpoints": [], "policy_version": None, "updated_at": None}
    return json_response(registry)
