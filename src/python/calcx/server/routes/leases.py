"""Run leases, for trainers: take a run (refused while another trainer holds it, unless taken
over), renew it while running, release it at a clean end (calcx.server.store.run_leases)."""

from __future__ import annotations

import logging

from fastapi import Request
from fastapi.responses import Response

from calcx.api import endpoints as api
from calcx.api.models import LeaseRenewal, LeaseRequest
from calcx.server.errors import APIError, json_response
from calcx.server.routing import Routes
from calcx.server.state import ServerState

routes = Routes()
log = logging.getLogger("calcx.server")


@routes.serve(api.ACQUIRE_LEASE)
async def acquire(request: Request, state: ServerState, body: LeaseRequest) -> Response:
    s = state.settings
    lease = state.db.leases.acquire(body.run, body.owner, body.take_over, s.run_lease_s, s.max_run_leases)
    if lease["took_over"]:
        log.warning(
            "run %r taken over by trainer %r from trainer %r, whose writes for it are now refused",
            body.run,
            body.owner,
            lease["previous_owner"],
        )
    return json_response(lease)


@routes.serve(api.RENEW_LEASE)
async def renew(request: Request, state: ServerState, body: LeaseRenewal) -> Response:
    s = state.settings
    return json_response(state.db.leases.renew(body.run, body.owner, s.run_lease_s, s.max_run_leases))


@routes.serve(api.RELEASE_LEASE)
async def release(request: Request, state: ServerState, body: LeaseRenewal) -> Response:
    lease = state.db.leases.release(body.run, body.owner, state.settings.run_lease_s)
    if lease is None:
        raise APIError(404, "not_found", f"run {body.run!r} has no lease")
    return json_response(lease)
