"""`/healthz` and `/metrics`: open, for load balancers, probes and Prometheus."""

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
    status = "ok" if state.service.serving else "unavailable"
    return json_response({"status": status, "version": __version__}, 200 if status == "ok" else 503)


@routes.serve(api.METRICS)
async def prometheus_metrics(request: Request, state: ServerState, body: None) -> Response:
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
