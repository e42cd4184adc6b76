"""The training ledger, for trainers: which rollouts each step trained, and the steps a resumed run
rolled back (calcx.server.store.trained; docs/resume.md)."""

from __future__ import annotations

import logging

from fastapi import Request
from fastapi.responses import Response

from calcx.api.models import RewindRequest, TrainedRequest
from calcx.server.auth import server_key
from calcx.server.errors import json_response, read_model
from calcx.server.routing import Router
from calcx.server.state import ServerState

router = Router(audience=server_key)
log = logging.getLogger("calcx.server")


@router.post("/v1/trained")
async def record_trained(request: Request, state: ServerState) -> Response:
    body = await read_model(request, TrainedRequest, state.settings.max_body_bytes)
    recorded = state.db.trained.record(body.run, body.step, body.rollout_ids)
    return json_response({"run": body.run, "step": body.step, "recorded": recorded})


@router.post("/v1/trained/rewind")
async def rewind(request: Request, state: ServerState) -> Response:
    body = await read_model(request, RewindRequest, state.settings.max_body_bytes)
    steps = state.db.trained.rewind(body.run, body.after_step)
    if steps:
        log.warning("run %r resumed after step %d: rolled back the training records of steps %s", body.run,
                    body.after_step, steps)
    return json_response({"run": body.run, "after_step": body.after_step, "rolled_back": steps})
