"""Rollouts, for trainers and the rehearsal: create, read, wait, retry, recorded calls, and the
cursor over terminal attempts."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from calcx.api import endpoints as api
from calcx.api.models import ROLLOUT_STATES, CancelRequest, CreateRolloutsRequest, RetryRequest, WaitRequest
from calcx.server.errors import APIError, json_response, query_float, query_int
from calcx.server.routing import Routes
from calcx.server.state import ServerState

routes = Routes()


@routes.serve(api.CREATE_ROLLOUTS)
async def create_rollouts(request: Request, state: ServerState, body: CreateRolloutsRequest) -> Response:
    return json_response({"rollouts": state.service.create(body)})


@routes.serve(api.LIST_ROLLOUTS)
async def list_rollouts(request: Request, state: ServerState, body: None) -> Response:
    q = request.query_params
    settings = state.settings
    state_filter = q.get("state") or None
    if state_filter is not None and state_filter not in ROLLOUT_STATES:
        raise APIError(422, "invalid_query", f"state={state_filter!r} must be one of {', '.join(ROLLOUT_STATES)}")
    rollouts = state.db.rollouts.query(
        state=state_filter,
        group_id=q.get("group_id") or None,
        controller_id=q.get("controller_id") or None,
        limit=query_int("limit", q.get("limit"), settings.page_limit, 1, settings.max_page_limit),
        offset=query_int("offset", q.get("offset"), 0, 0, 2**62),
    )
    return json_response({"rollouts": rollouts})


@routes.serve(api.GET_ROLLOUT)
async def get_rollout(request: Request, state: ServerState, body: None) -> Response:
    return json_response(state.service.rollout(request.path_params["rid"]))


@routes.serve(api.WAIT)
async def wait_rollout(request: Request, state: ServerState, body: WaitRequest) -> Response:
    return json_response(await state.service.wait(request.path_params["rid"], body.timeout_s))


@routes.serve(api.RETRY)
async def retry_rollout(request: Request, state: ServerState, body: RetryRequest) -> Response:
    return json_response(state.service.retry(request.path_params["rid"], force=body.force))


@routes.serve(api.CANCEL)
async def cancel(request: Request, state: ServerState, body: CancelRequest) -> Response:
    return json_response(state.service.cancel(body))


@routes.serve(api.CALLS)
async def list_calls(request: Request, state: ServerState, body: None) -> Response:
    attempt_id = request.query_params.get("attempt_id") or None
    return json_response({"calls": state.db.calls.query(request.path_params["rid"], attempt_id)})


@routes.serve(api.TERMINAL)
async def terminal(request: Request, state: ServerState, body: None) -> Response:
    q = request.query_params
    settings = state.settings
    after = query_int("after", q.get("after"), 0, 0, 2**62)
    limit = query_int("limit", q.get("limit"), settings.page_limit, 1, settings.max_page_limit)
    timeout_s = query_float("timeout_s", q.get("timeout_s"), settings.terminal_poll_s)
    return json_response(await state.service.terminal(after, limit, timeout_s))
