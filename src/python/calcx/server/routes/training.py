"""The training ledger, for trainers: which rollouts each step trained, and the steps a resumed run
rolled back (calcx.server.store.trained; docs/resume.md)."""

from __future__ import annotations

import logging

from fastapi import Request
from fastapi.responses import Response

from calcx.api import endpoints as api
from calcx.api.models import RewindRequest, TrainedRequest
from calcx.server.errors import json_response
from calcx.server.routing import Routes
from calcx.server.state import ServerState

routes = Routes()
log = logging.getLogger("calcx.server")


@routes.serve(api.RECORD_TRAINED)
async def record_trained(request: Request, state: ServerState, body: TrainedRequest) -> Response:
    recorded = state.db.trained.record(body.run, body.step, body.rollout_ids, body.owner)
    return json_response({"run": body.run, "step": body.step, "recorded": recorded})


@routes.serve(api.REWIND)
async def rewind(request: Request, state: ServerState, body: RewindRequest) -> Response:
    steps = state.db.trained.rewind(body.run, body.after_step, body.owner)
    if steps:
        log.warning(
            "run %r resumed after step %d: rolled back the training records of steps %s",
            body.run,
            body.after_step,
            steps,
        )
    return json_response({"run": body.run, "after_step": body.after_step, "rolled_back": steps})
