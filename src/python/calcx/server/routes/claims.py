"""Claims, for controllers: take queued rollouts, keep their leases, report how each ended."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from calcx.api.models import ClaimRequest, FinishRequest, HeartbeatRequest
from calcx.server.auth import server_key
from calcx.server.errors import json_response, read_model
from calcx.server.routing import Router
from calcx.server.state import ServerState

router = Router(audience=server_key)


@router.post("/v1/claims")
async def claim(request: Request, state: ServerState) -> Response:
    body = await read_model(request, ClaimRequest, state.settings.max_body_bytes)
    return json_response(await state.service.claim(body, request.is_disconnected))


@router.post("/v1/claims/heartbeat")
async def heartbeat(request: Request, state: ServerState) -> Response:
    body = await read_model(request, HeartbeatRequest, state.settings.max_body_bytes)
    return json_response(state.service.heartbeat(body))


@router.post("/v1/rollouts/{rid}/attempts/{aid}/finish")
async def finish(request: Request, state: ServerState) -> Response:
    rid, aid = request.path_params["rid"], request.path_params["aid"]
    body = await read_model(request, FinishRequest, state.settings.max_body_bytes)
    return json_response(state.service.finish(rid, aid, body))
