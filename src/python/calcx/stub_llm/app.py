"""The stub LLM's HTTP face: an OpenAI-compatible chat-completions server.

Routes: ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /healthz`` and
``GET /stub/stats`` (request counts per mode and turn, for tests and rehearsals).
Responses carry vLLM-style extras when asked: top-level ``prompt_token_ids`` and
per-choice ``token_ids`` (``return_token_ids: true``), ``logprobs``
(``logprobs: true``). The normal path does no waiting at all.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import Counter, deque
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from calcx.stub_llm.modes import Mode, ModeError, parse_mode, select_mode
from calcx.stub_llm.player import Turn, conversation_text, first_text, play
from calcx.stub_llm.script import Script, strip_markers
from calcx.stub_llm.tokens import encode, logprobs_block, render_prompt, render_tool_calls

DEFAULT_MODEL_NAME = "calcx-stub"
DEFAULT_SLOW_S = 1.0
DEFAULT_HANG_S = 3600.0
# the log keeps each request's question and the start of its system message (which one the agent sent)
LOGGED_SYSTEM_CHARS = 200


#: vLLM's answer to a conversation past the model's context, as vLLM 0.24 words it (a 400, its
#: `code` the status itself: no code of its own)
OVERLONG_ERROR = {
    "message": "This model's maximum context length is 4096 tokens. However, you requested 1024 output tokens "
    "and your prompt contains at least 3073 input tokens, for a total of at least 4097 tokens. Please reduce the "
    "length of the input prompt or the number of requested output tokens. (parameter=input_tokens, value=3073)",
    "type": "BadRequestError",
    "param": "input_tokens",
    "code": 400,
}


def _error(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": code, "code": code}})


def _validate(body: Any) -> str | None:
    """What is wrong with the request body, or None."""
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list"
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return f"messages[{index}] must be an object with a string 'role'"
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        return "'tools' must be a list"
    if body.get("stream"):
        return "streaming is not supported by the stub LLM; send 'stream': false"
    return None


def build_response(body: dict, turn: Turn, model_name: str) -> dict:
    """The chat.completion object for ``turn``, with token ids, logprobs and usage."""
    prompt_text = render_prompt(body["messages"], body.get("tools"))
    response_text = turn.content if turn.content is not None else render_tool_calls(turn.tool_calls)
    prompt_ids = encode(prompt_text)
    response_ids = encode(response_text)
    message: dict[str, Any] = {"role": "assistant", "content": turn.content}
    if turn.tool_calls:
        message["tool_calls"] = turn.tool_calls
    n = body.get("n") or 1
    n = n if isinstance(n, int) and 1 <= n <= 8 else 1
    choices = []
    for index in range(n):
        choice: dict[str, Any] = {
            "index": index,
            "message": message,
            "finish_reason": turn.finish_reason,
            "logprobs": None,
        }
        if body.get("logprobs"):
            top = body.get("top_logprobs") or 0
            choice["logprobs"] = logprobs_block(response_text, top if isinstance(top, int) else 0)
        if body.get("return_token_ids"):
            choice["token_ids"] = response_ids
        choices.append(choice)
    digest = hashlib.sha256((prompt_text + "\x00" + response_text).encode("utf-8")).hexdigest()[:24]
    response: dict[str, Any] = {
        "id": f"chatcmpl-stub-{digest}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model") if isinstance(body.get("model"), str) else model_name,
        "choices": choices,
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(response_ids) * n,
            "total_tokens": len(prompt_ids) + len(response_ids) * n,
        },
    }
    if body.get("return_token_ids"):
        response["prompt_token_ids"] = prompt_ids
    return response


def create_app(
    *,
    script: Script | None = None,
    mode: str | Mode = "normal",
    model_name: str = DEFAULT_MODEL_NAME,
    slow_s: float = DEFAULT_SLOW_S,
    hang_s: float = DEFAULT_HANG_S,
    log_size: int = 2000,
) -> FastAPI:
    """A stub LLM app. ``mode`` is the server-wide default; requests may pick another."""
    server_mode = mode if isinstance(mode, Mode) else parse_mode(mode)
    script = script or Script()
    app = FastAPI(title="calcx stub LLM")
    app.state.script = script
    app.state.counts = Counter()
    app.state.log = deque(maxlen=log_size)

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok", "mode": server_mode.name, "script_entries": len(script)}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "calcx"}]}

    @app.get("/stub/stats")
    async def stats() -> dict:
        return {"counts": dict(app.state.counts)}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> JSONResponse:
        try:
            body = json.loads(await request.body())
        except ValueError as exc:
            return _error(400, f"request body is not valid JSON: {exc}", "invalid_request_error")
        problem = _validate(body)
        if problem:
            return _error(400, problem, "invalid_request_error")
        try:
            mode = select_mode(conversation_text(body["messages"]), request.headers.get("x-stub-mode"), server_mode)
        except ModeError as exc:
            return _error(400, str(exc), "invalid_request_error")
        question = strip_markers(first_text(body["messages"]))[:200]
        system = first_text(body["messages"], "system")[:LOGGED_SYSTEM_CHARS]
        if mode.name == "error500":
            _record(app, mode, "error500", question, system)
            return _error(500, "stub LLM: simulated server error (mode error500)", "server_error")
        if mode.name == "hang":
            _record(app, mode, "hang", question, system)
            await asyncio.sleep(mode.seconds if mode.seconds is not None else hang_s)
            return _error(504, "stub LLM: hang mode gave up waiting", "timeout")
        if mode.name == "overlong" and any(m.get("role") == "tool" for m in body["messages"]):
            _record(app, mode, "overlong", question, system)
            return JSONResponse(status_code=400, content={"error": OVERLONG_ERROR})
        if mode.name == "slow":
            await asyncio.sleep(mode.seconds if mode.seconds is not None else slow_s)
        turn = play(body, mode, script)
        _record(app, mode, turn.kind, question, system)
        return JSONResponse(build_response(body, turn, model_name))

    return app


def _record(app: FastAPI, mode: Mode, kind: str, question: str, system: str) -> None:
    app.state.counts[f"{mode.name}:{kind}"] += 1
    app.state.log.append({"mode": mode.name, "kind": kind, "question": question, "system": system})
