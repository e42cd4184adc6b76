"""Events, for agents: the reward (and anything else) an attempt reports."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from calcx.api import endpoints as api
from calcx.api.models import EventCreate
from calcx.server.errors import json_response
from calcx.server.routing import Routes
from calcx.server.state import ServerState

routes = Routes()


@routes.serve(api.POST_EVENT)
async def post_event(request: Request, state: ServerState, body: EventCreate) -> Response:
    rid, aid = request.path_params["rid"], request.path_params["aid"]
    return json_response({"event_id": state.service.add_event(rid, aid, body)})
