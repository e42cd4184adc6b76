"""Claims, for controllers: take queued rollouts, keep their leases, report how each ended."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from calcx.api import endpoints as api
from calcx.api.models import ClaimRequest, FinishRequest, HeartbeatRequest
from calcx.server.errors import json_response
from calcx.server.routing import Routes
from calcx.server.state import ServerState

routes = Routes()


@routes.serve(api.CLAIM)
async def claim(request: Request, state: ServerState, body: ClaimRequest) -> Response:
    return json_response(await state.service.claim(body, request.is_disconnected))


@routes.serve(api.HEARTBEAT)
async def heartbeat(request: Request, state: ServerState, body: HeartbeatRequest) -> Response:
    return json_response(state.service.heartbeat(body))


@routes.serve(api.FINISH)
async def finish(request: Request, state: ServerState, body: FinishRequest) -> Response:
    rid, aid = request.path_params["rid"], request.path_params["aid"]
    return json_response(state.service.finish(rid, aid, body))
