"""`/healthz` and `/metrics`: open, for load balancers, probes and Prometheus. `/healthz` checks
that the store can write, with one small write."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from calcx.api import endpoints as api
from calcx.server import __version__
from calcx.server.errors import json_response
from calcx.server.routing import Routes
from calcx.server.state import ServerState

routes = Routes()


@routes.serve(api.HEALTH)
async def healthz(request: Request, state: ServerState, body: None) -> Response:
    """Ok only while the server serves and its store takes a write (one committed row): a full
    disk, a read-only file or another process holding the database's lock is a 503 that says so."""
    if not state.service.serving:
        return json_response({"status": "unavailable", "version": __version__, "store": "not open"}, 503)
    problem = state.db.write_problem()
    if problem is not None:
        return json_response({"status": "unavailable", "version": __version__, "store": problem}, 503)
    return json_response({"status": "ok", "version": __version__, "store": "writable"})


@routes.serve(api.METRICS)
async def prometheus_metrics(request: Request, state: ServerState, body: None) -> Response:
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
