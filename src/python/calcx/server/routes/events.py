"""Events, for agents: the reward (and anything else) an attempt reports."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from calcx.api.models import EventCreate
from calcx.server.auth import own_attempt
from calcx.server.errors import json_response, read_model
from calcx.server.routing import Router
from calcx.server.state import ServerState

router = Router(audience=own_attempt)


@router.post("/v1/rollouts/{rid}/attempts/{aid}/events")
async def post_event(request: Request, state: ServerState) -> Response:
    rid, aid = request.path_params["rid"], request.path_params["aid"]
    body = await read_model(request, EventCreate, state.settings.max_body_bytes)
    return json_response({"event_id": state.service.add_event(rid, aid, body)})
