"""`/healthz` and `/metrics`: open, for load balancers, probes and Prometheus."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from calcx.server import __version__
from calcx.server.errors import json_response
from calcx.server.routing import Router
from calcx.server.state import ServerState

router = Router(audience=None)


@router.get("/healthz")
async def healthz(request: Request, state: ServerState) -> Response:
    status = "ok" if state.service.serving else "unavailable"
    return json_response({"status": status, "version": __version__}, 200 if status == "ok" else 503)


@router.get("/metrics")
async def prometheus_metrics(request: Request, state: ServerState) -> Response:
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
