"""The fault proxy: an OpenAI-compatible proxy between the gateway and the stub LLM that plays
the faults the stub cannot (``[fault:...]`` markers in the conversation).

    python -m calcx.faults.proxy --upstream URL --canary FILE"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from calcx.common.serving import bind_socket, plain_server, url_of
from calcx.faults.hostile import hostile_answers

FAULT_MARKER_RE = re.compile(r"\[fault:([a-z0-9_-]+)(?:=([a-z0-9_-]+))?\]", re.IGNORECASE)


def _conversation(messages: list[dict[str, Any]]) -> str:
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "\n".join(out)


def create_proxy_app(upstream: str, canary: Path) -> Any:
    """An OpenAI-compatible proxy that forwards to ``upstream`` unless a ``[fault:...]`` marker
    in the conversation asks for a fault the stub cannot play:

    - ``reflect-tool``: after the tool result, answer with another tool call (reflection turn);
    - ``garbage``: HTTP 200 with a body that is not JSON;
    - ``answer=import|power|huge|eval``: after the tool result, a hostile final answer.
    """
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    client = httpx.AsyncClient(base_url=upstream.rstrip("/"), timeout=httpx.Timeout(600.0, connect=5.0))
    answers = hostile_answers(canary)
    counts: Counter[str] = Counter()

    async def stats(request: Any) -> Response:
        return JSONResponse({"counts": dict(counts)})

    async def forward(request: Any) -> Response:
        path = request.path_params["path"]
        raw = await request.body()
        if request.method == "POST" and path == "chat/completions":
            try:
                body = json.loads(raw)
                messages = body.get("messages") or []
                match = FAULT_MARKER_RE.search(_conversation(messages))
            except (ValueError, AttributeError):
                match, messages = None, []
            if match:
                name, arg = match.group(1).lower(), (match.group(2) or "").lower()
                after_tool = bool(messages) and messages[-1].get("role") == "tool"
                if name == "garbage":
                    counts["garbage"] += 1
                    return Response(b'<html>502 oops {"choices": [', status_code=200, media_type="application/json")
                if name == "reflect-tool" and after_tool:
                    counts["reflect-tool"] += 1
                    return JSONResponse(
                        _completion(
                            None,
                            [
                                {
                                    "id": "call_reflect",
                                    "type": "function",
                                    "function": {"name": "calculate", "arguments": json.dumps({"expression": "2+2"})},
                                }
                            ],
                        )
                    )
                if name == "answer" and after_tool and arg in answers:
                    counts[f"answer={arg}"] += 1
                    return JSONResponse(_completion(f"### ANSWER: {answers[arg]} ###", None))
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "x-stub-mode")}
        upstream_resp = await client.request(request.method, f"/{path}", content=raw, headers=headers)
        return Response(
            upstream_resp.content,
            status_code=upstream_resp.status_code,
            media_type=upstream_resp.headers.get("content-type", "application/json"),
        )

    app = Starlette(routes=[Route("/proxy/stats", stats), Route("/v1/{path:path}", forward, methods=["GET", "POST"])])
    return app


def _completion(content: str | None, tool_calls: list[dict[str, Any]] | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-fault",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "fault-proxy",
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop", "logprobs": None}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m calcx.faults.proxy", description="The fault proxy, alone.")
    p.add_argument("--upstream", required=True, help="the stub LLM's base URL (.../v1)")
    p.add_argument("--canary", required=True, help="file a hostile answer would create if it were executed")
    args = p.parse_args(argv)
    upstream = args.upstream.rstrip("/")
    upstream = upstream[:-3] if upstream.endswith("/v1") else upstream
    sock = bind_socket()
    server = plain_server(create_proxy_app(upstream + "/v1", Path(args.canary)))
    print(f"fault proxy serving on {url_of(sock)}/v1", flush=True)
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
