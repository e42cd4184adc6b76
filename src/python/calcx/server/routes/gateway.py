"""The OpenAI-compatible gateway, for agents: each attempt's own `.../v1` base URL.

Forwarding and recording are calcx.server.gateway's; this module checks that the attempt may
call the model now.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from calcx.api import endpoints as api
from calcx.server.errors import APIError, declared_length, json_response, read_json
from calcx.server.gateway import encode_request
from calcx.server.routing import Routes
from calcx.server.state import ServerState

routes = Routes()


@routes.serve(api.CHAT_COMPLETIONS)
async def chat_completions(request: Request, state: ServerState, body: None) -> Response:
    """One model call of a RUNNING attempt. In order, before anything is forwarded: the attempt
    still has a call and the request's declared bytes left (before its body is read), the body
    reads as a chat completion, a model is registered, and then the call is reserved (its
    forwarded bytes, against the recorded and the reserved calls: calcx.server.budget) until it
    is recorded, fails or is cancelled."""
    rid, aid = request.path_params["rid"], request.path_params["aid"]
    _require_running(state, rid, aid)
    budgets, calls = state.budgets, state.db.calls
    budgets.require_room(calls, rid, aid, declared_length(request))
    payload = await read_json(request, state.settings.body_limit(api.CHAT_COMPLETIONS.name))
    registry = state.registry
    if not registry.get("endpoints"):
        raise APIError(
            503,
            "no_model",
            "no model is registered; the trainer (or rehearsal) must PUT /v1/models with the inference "
            "endpoints first",
        )
    gateway = state.gateway
    if gateway is None:
        raise APIError(503, "starting", "the server is starting or stopping; try again shortly")
    # Each call is recorded with the registry's policy version at the time of the call: the
    # version the replicas serve (the trainer updates it after every weight sync), so the lag of
    # what is trained on is measured, not declared. The rollout's own sampling parameters, when it
    # has any, override the agent's.
    sampling = state.db.rollouts.sampling(rid)
    upstream_request = gateway.apply_sampling(gateway.prepare(payload, registry), sampling, rid)
    encoded = encode_request(upstream_request)
    # Read again after the body: the attempt may have ended while it streamed in.
    _require_running(state, rid, aid)
    with budgets.call(calls, rid, aid, len(encoded)):
        # The gateway reads the registry again when it resends a call the model server aborted
        # (generation paused for a weight update).
        answer = await gateway.forward(
            rid, aid, upstream_request, lambda: state.registry, request.is_disconnected, encoded=encoded
        )
    if answer.failure is not None:
        # e.g. model_aborted: the attempt fails as infrastructure before the agent could score an
        # empty answer, whatever the agent does with the error it gets.
        state.service.fail(rid, aid, answer.failure, answer.detail)
    return Response(content=answer.content, status_code=answer.status, media_type="application/json")


def _require_running(state: ServerState, rid: str, aid: str) -> None:
    current = state.db.attempts.state(rid, aid)
    if current != "RUNNING":
        raise APIError(
            409,
            "attempt_not_running",
            f"attempt {aid} of rollout {rid!r} is {current}; the gateway serves only RUNNING attempts",
        )


@routes.serve(api.OPENAI_MODELS)
async def openai_models(request: Request, state: ServerState, body: None) -> Response:
    model = state.registry.get("model")
    data = [] if not model else [{"id": model, "object": "model", "owned_by": "calcx"}]
    return json_response({"object": "list", "data": data})
