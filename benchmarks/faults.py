"""Fault and hostile-input run: what a calcx rehearsal survives, measured.

Starts the whole loop as real processes on loopback (server, stub LLM behind a small fault
proxy, controller with the local runner, real agents and MCP calculators), submits a rehearsal
of N rollouts, and while it runs:

- rows carry failure markers: the stub's ``[stub:error500]``, ``[stub:hang=S]``,
  ``[stub:badjson]``, the proxy's ``[fault:reflect-tool]`` (a tool call in the reflection turn),
  ``[fault:garbage]`` (a 200 whose body is not JSON) and hostile final answers
  (``__import__(...)``, ``9**9**9``, 10 MB); rows whose calculator expression is ``9**9**8``
  hang the calculator; hostile question texts (YAML/JSON/shell breakers) must reach the agent
  byte for byte;
- an injector kills agents and calculators by pid (descendants of the controller, matched to
  rollouts through the controller's log and the calculator's pipes), restarts the server
  (SIGTERM and SIGKILL, same port and database), SIGKILLs and restarts the controller, and runs
  a second controller for a while;
- a hostile client hits every endpoint with wrong or missing keys, malformed, oversized and
  unknown events, events for unknown and finished rollouts and cross-rollout gateway calls, and
  checks each status code.

At the end it audits the store: every rollout terminal, every FAILED attempt with a reason,
a reward on every SUCCEEDED one, no attempt started twice, rewards the agents reported present,
planned faults ending as planned, and recovery time after each restart. ``--queued N`` also
measures the server with N rollouts queued at once. ``--write`` puts the figures into
benchmarks/FAULTS.md.

    PYTHONPATH=src/python /opt/calcx-dev/bin/python benchmarks/faults.py --n 200 --queued 1000 --write

``python benchmarks/faults.py proxy --upstream URL`` serves the fault proxy alone.
The tests in tests/faults import this file for its hostile inputs, client, proxy and audit.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import signal
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src" / "python") not in sys.path:
    sys.path.insert(0, str(ROOT / "src" / "python"))

import httpx  # noqa: E402

from calcx.api.tokens import attempt_token  # noqa: E402
from calcx.procs.procutil import (  # noqa: E402
    descendants,
    pid_alive,
    process_name,
    process_start_time,
    rss_bytes,
)

KEY = "calcx-faults-key"
MAX_BODY_BYTES = 1024 * 1024  # the server runs with this --max-body-bytes (oversized = above it)
FAULT_MARKER_RE = re.compile(r"\[fault:([a-z0-9_-]+)(?:=([a-z0-9_-]+))?\]", re.IGNORECASE)

# ------------------------------------------------------------------------------------------------
# Hostile inputs
# ------------------------------------------------------------------------------------------------

#: Question texts built to break YAML, JSON, shells and templates. Each is appended (as its own
#: paragraph) to a real question, so the stub still finds the arithmetic and the rollout should
#: succeed; the agent must receive the whole text exactly.
HOSTILE_QUESTION_SUFFIXES: dict[str, str] = {
    "yaml-structure": 'key: value\n---\n- item\n? complex\n: mapping\n"quoted": \'single\'\n# comment\n...',
    "yaml-tags": "!!python/object/apply:os.system ['touch /tmp/calcx-yaml-pwned'] &anchor *anchor !Ref x",
    "json-breakers": '"}], "rollout_id": "evil", "x": {"\\u0000\\\\" \\n \u2028\u2029 {{"a":1}}',
    "shell": "$(touch /tmp/calcx-shell-pwned) `id` ; rm -rf / && echo $HOME | cat /etc/passwd > /dev/null 2>&1 &",
    "template": "{{ 7*7 }} {% if true %}x{% endif %} ${jndi:ldap://x} %(name)s {0} <script>alert(1)</script>",
    "unicode": "Ω≈ç√∫ 😀 \u202eevil\u202c \ufeff zero\u200bwidth \U0001F4A9 e\u0301 ﷽ \t\r\n\x0b\x0c",
    "long": ("The long way round. " * 6000).strip(),  # ~120 KB, under the 128 KiB env value limit
}

#: Texts no process environment can carry: the attempt must fail with a reason, not vanish.
UNCARRIABLE_QUESTION_SUFFIXES: dict[str, str] = {
    "nul-byte": "before\x00after",
}

CANARY_NAME = "hostile-answer-canary"


def hostile_answers(canary: Path) -> dict[str, str]:
    """Final answers a model could give that the reward must survive (never executed, never hang)."""
    return {
        "import": f"__import__('os').system('touch {canary}')",
        "power": "9**9**9",
        "huge": "9" * (10 * 1024 * 1024),
        "eval": f"eval(\"open('{canary}', 'w').write('x')\")",
    }


# ------------------------------------------------------------------------------------------------
# Fault proxy: sits between the gateway and the stub LLM
# ------------------------------------------------------------------------------------------------


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
                    return Response(b"<html>502 oops {\"choices\": [", status_code=200, media_type="application/json")
                if name == "reflect-tool" and after_tool:
                    counts["reflect-tool"] += 1
                    return JSONResponse(_completion(None, [{
                        "id": "call_reflect", "type": "function",
                        "function": {"name": "calculate", "arguments": json.dumps({"expression": "2+2"})}}]))
                if name == "answer" and after_tool and arg in answers:
                    counts[f"answer={arg}"] += 1
                    return JSONResponse(_completion(f"### ANSWER: {answers[arg]} ###", None))
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "x-stub-mode")}
        upstream_resp = await client.request(request.method, f"/{path}", content=raw, headers=headers)
        return Response(upstream_resp.content, status_code=upstream_resp.status_code,
                        media_type=upstream_resp.headers.get("content-type", "application/json"))

    app = Starlette(routes=[Route("/proxy/stats", stats), Route("/v1/{path:path}", forward, methods=["GET", "POST"])])
    return app


def _completion(content: str | None, tool_calls: list[dict[str, Any]] | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {"id": "chatcmpl-fault", "object": "chat.completion", "created": int(time.time()), "model": "fault-proxy",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop",
                         "logprobs": None}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def proxy_main(argv: list[str]) -> int:
    import uvicorn

    p = argparse.ArgumentParser(prog="faults.py proxy")
    p.add_argument("--upstream", required=True, help="the stub LLM's base URL (.../v1)")
    p.add_argument("--canary", required=True, help="file a hostile answer would create if it were executed")
    args = p.parse_args(argv)
    upstream = args.upstream.rstrip("/")
    upstream = upstream[:-3] if upstream.endswith("/v1") else upstream
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(create_proxy_app(upstream + "/v1", Path(args.canary)), log_level="warning")
    print(f"fault proxy serving on http://127.0.0.1:{port}/v1", flush=True)
    uvicorn.Server(config).run(sockets=[sock])
    return 0


# ------------------------------------------------------------------------------------------------
# Hostile HTTP client
# ------------------------------------------------------------------------------------------------


@dataclass
class Case:
    """One hostile request and the status it must get (and, where it matters, the error code)."""

    name: str
    method: str
    path: str
    expect: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None
    code: str | None = None


@dataclass
class Outcome:
    case: Case
    status: int  # 0: no answer (server down)
    code: str | None
    ok: bool


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "content-type": "application/json"}


def _j(value: Any) -> bytes:
    return json.dumps(value).encode()


def static_cases(key: str, decoy: tuple[str, str], finished: tuple[str, str]) -> list[Case]:
    """Hostile requests that need no live rollout: every endpoint, wrong/missing keys, bad bodies.

    ``decoy`` is a (rid, aid) RUNNING attempt the caller holds; ``finished`` a terminal one.
    Nothing here may change state: no valid claim, no valid reward on a real attempt.
    """
    drid, daid = decoy
    frid, faid = finished
    server = _auth(key)
    wrong = _auth("not-the-key")
    none = {"content-type": "application/json"}
    forged = _auth(f"calcx-at.{drid}.{daid}.{'0' * 64}")
    decoy_token = _auth(attempt_token(key, drid, daid))
    finished_token = _auth(attempt_token(key, frid, faid))
    ev = f"/v1/rollouts/{drid}/attempts/{daid}/events"
    gw = f"/v1/rollouts/{drid}/attempts/{daid}/v1/chat/completions"
    chat = _j({"messages": [{"role": "user", "content": "hi"}]})
    cases: list[Case] = []
    server_key_endpoints = [
        ("POST", "/v1/rollouts", _j({"rollouts": []})),
        ("GET", "/v1/rollouts", None),
        ("GET", f"/v1/rollouts/{drid}", None),
        ("POST", f"/v1/rollouts/{drid}/wait", _j({"timeout_s": 0})),
        ("POST", f"/v1/rollouts/{drid}/retry", None),
        ("GET", f"/v1/rollouts/{drid}/calls", None),
        ("GET", "/v1/terminal?timeout_s=0", None),
        ("POST", "/v1/claims", _j({"controller_id": "hostile", "max": 1, "timeout_s": 0})),
        ("POST", "/v1/claims/heartbeat", _j({"controller_id": "hostile", "attempts": None})),
        ("POST", f"/v1/rollouts/{drid}/attempts/{daid}/finish", _j({"state": "FAILED", "reason": "crash"})),
        ("PUT", "/v1/models", _j({"model": "evil", "endpoints": ["http://127.0.0.1:9/v1"]})),
        ("GET", "/v1/models", None),
    ]
    for method, path, body in server_key_endpoints:
        tag = f"{method} {path.split('?')[0]}"
        cases.append(Case(f"no key: {tag}", method, path, 401, none, body, "unauthorized"))
        cases.append(Case(f"wrong key: {tag}", method, path, 401, wrong, body, "unauthorized"))
        cases.append(Case(f"attempt token on server-key endpoint: {tag}", method, path, 403, decoy_token, body,
                          "forbidden"))
    for path, body in ((ev, _j({"event_type": "log", "data": {}})), (gw, chat),
                       (f"/v1/rollouts/{drid}/attempts/{daid}/v1/models", None)):
        method = "GET" if body is None else "POST"
        tag = f"{method} {path}"
        cases.append(Case(f"no key: {tag}", method, path, 401, none, body, "unauthorized"))
        cases.append(Case(f"wrong key: {tag}", method, path, 401, wrong, body, "unauthorized"))
        cases.append(Case(f"forged attempt token: {tag}", method, path, 401, forged, body, "unauthorized"))
        cases.append(Case(f"other attempt's token: {tag}", method, path, 403, finished_token, body, "forbidden"))
    cases += [
        # malformed, oversized and unknown events on a RUNNING attempt
        Case("event: broken JSON", "POST", ev, 422, decoy_token, b'{"event_type": "reward", "data": {', "invalid_json"),
        Case("event: empty body", "POST", ev, 422, decoy_token, b"", "invalid_json"),
        Case("event: not UTF-8", "POST", ev, 422, decoy_token, b'{"event_type": "\xff\xfe"}', "invalid_json"),
        Case("event: JSON array", "POST", ev, 422, decoy_token, b"[1, 2]", "invalid_body"),
        Case("event: no event_type", "POST", ev, 422, decoy_token, _j({"data": {"value": 1}}), "invalid_body"),
        Case("event: data not an object", "POST", ev, 422, decoy_token, _j({"event_type": "log", "data": [1]}),
             "invalid_body"),
        Case("reward: NaN", "POST", ev, 422, decoy_token, b'{"event_type": "reward", "data": {"value": NaN}}',
             "invalid_json"),
        Case("reward: Infinity", "POST", ev, 422, decoy_token,
             b'{"event_type": "reward", "data": {"value": Infinity}}', "invalid_json"),
        Case("reward: 1e999", "POST", ev, 422, decoy_token, b'{"event_type": "reward", "data": {"value": 1e999}}',
             "invalid_reward"),
        Case("reward: string", "POST", ev, 422, decoy_token, _j({"event_type": "reward", "data": {"value": "1.0"}}),
             "invalid_reward"),
        Case("reward: missing value", "POST", ev, 422, decoy_token, _j({"event_type": "reward", "data": {}}),
             "invalid_reward"),
        Case("event: oversized (Content-Length)", "POST", ev, 413, decoy_token,
             _j({"event_type": "log", "data": {"x": "y" * (MAX_BODY_BYTES + 10)}}), "body_too_large"),
        Case("event: unknown type is stored as data", "POST", ev, 200, decoy_token,
             _j({"event_type": "definitely-unknown-\u202e", "data": {"nested": {"a": [1, 2, {"b": None}]}}})),
        Case("event: unknown rollout", "POST", "/v1/rollouts/no-such-rollout/attempts/1/events", 404, server,
             _j({"event_type": "log", "data": {}}), "not_found"),
        Case("event: unknown attempt", "POST", f"/v1/rollouts/{drid}/attempts/99/events", 404, server,
             _j({"event_type": "log", "data": {}}), "not_found"),
        Case("event: finished attempt (its own token)", "POST", f"/v1/rollouts/{frid}/attempts/{faid}/events", 409,
             finished_token, _j({"event_type": "reward", "data": {"value": 1.0}}), "conflict"),
        # gateway
        Case("gateway: stream=true", "POST", gw, 400, decoy_token, _j({"messages": [{"role": "user", "content": "x"}],
                                                                       "stream": True}), "stream_unsupported"),
        Case("gateway: n=3", "POST", gw, 400, decoy_token, _j({"messages": [{"role": "user", "content": "x"}], "n": 3}),
             "invalid_request"),
        Case("gateway: no messages", "POST", gw, 400, decoy_token, _j({"messages": []}), "invalid_request"),
        Case("gateway: broken JSON", "POST", gw, 422, decoy_token, b'{"messages": [', "invalid_json"),
        Case("gateway: finished attempt", "POST", f"/v1/rollouts/{frid}/attempts/{faid}/v1/chat/completions", 409,
             finished_token, chat, "attempt_not_running"),
        Case("gateway: oversized", "POST", gw, 413, decoy_token, b"[" + b"1," * (MAX_BODY_BYTES // 2 + 10) + b"1]",
             "body_too_large"),
        # controller and trainer endpoints with bad bodies or states
        Case("claims: max=0", "POST", "/v1/claims", 422, server, _j({"controller_id": "hostile", "max": 0}),
             "invalid_body"),
        Case("claims: no controller_id", "POST", "/v1/claims", 422, server, _j({"max": 1}), "invalid_body"),
        Case("claims: broken JSON", "POST", "/v1/claims", 422, server, b"{max: 1}", "invalid_json"),
        Case("heartbeat: attempts not a list", "POST", "/v1/claims/heartbeat", 422, server,
             _j({"controller_id": "hostile", "attempts": "all"}), "invalid_body"),
        Case("finish: bad state", "POST", f"/v1/rollouts/{drid}/attempts/{daid}/finish", 422, server,
             _j({"state": "DONE"}), "invalid_body"),
        Case("finish: FAILED without reason", "POST", f"/v1/rollouts/{drid}/attempts/{daid}/finish", 422, server,
             _j({"state": "FAILED"}), "invalid_body"),
        Case("finish: SUCCEEDED with reason", "POST", f"/v1/rollouts/{drid}/attempts/{daid}/finish", 422, server,
             _j({"state": "SUCCEEDED", "reason": "crash"}), "invalid_body"),
        Case("finish: unknown rollout", "POST", "/v1/rollouts/no-such-rollout/attempts/1/finish", 404, server,
             _j({"state": "FAILED", "reason": "crash"}), "not_found"),
        Case("finish: finished attempt", "POST", f"/v1/rollouts/{frid}/attempts/{faid}/finish", 409, server,
             _j({"state": "SUCCEEDED"}), "conflict"),
        Case("retry: unknown rollout", "POST", "/v1/rollouts/no-such-rollout/retry", 404, server, None, "not_found"),
        Case("retry: RUNNING rollout", "POST", f"/v1/rollouts/{drid}/retry", 409, server, None, "conflict"),
        Case("wait: unknown rollout", "POST", "/v1/rollouts/no-such-rollout/wait", 404, server, _j({"timeout_s": 0}),
             "not_found"),
        Case("get: unknown rollout", "GET", "/v1/rollouts/no-such-rollout", 404, server, None, "not_found"),
        Case("list: bad state", "GET", "/v1/rollouts?state=EXPLODED", 422, server, None, "invalid_query"),
        Case("list: limit=-1", "GET", "/v1/rollouts?limit=-1", 422, server, None, "invalid_query"),
        Case("terminal: after=abc", "GET", "/v1/terminal?after=abc", 422, server, None, "invalid_query"),
        Case("terminal: timeout_s=nan", "GET", "/v1/terminal?timeout_s=nan", 422, server, None, "invalid_query"),
        Case("create: bad rollout id", "POST", "/v1/rollouts", 422, server,
             _j({"rollouts": [{"rollout_id": "../../etc/passwd", "row": {"question": "q", "result": "1"}}]}),
             "invalid_body"),
        Case("create: row lacks env_map field", "POST", "/v1/rollouts", 422, server,
             _j({"rollouts": [{"rollout_id": "hostile-no-result", "row": {"question": "q"}}]}), "invalid_body"),
        Case("create: same id, other body", "POST", "/v1/rollouts", 409, server,
             _j({"rollouts": [{"rollout_id": frid, "row": {"question": "changed", "result": "0"}}]}), "conflict"),
        Case("create: oversized", "POST", "/v1/rollouts", 413, server,
             _j({"rollouts": [{"rollout_id": "big", "row": {"question": "q" * (MAX_BODY_BYTES + 1), "result": "1"}}]}),
             "body_too_large"),
        Case("models: no endpoints", "PUT", "/v1/models", 422, server, _j({"model": "x"}), "invalid_body"),
        Case("unknown endpoint", "GET", "/v1/nothing-here", 404, server, None, "not_found"),
        Case("wrong method", "DELETE", "/v1/rollouts", 405, server, None, "method_not_allowed"),
        Case("healthz is open", "GET", "/healthz", 200, none, None),
    ]
    return cases


def live_cases(key: str, running: list[tuple[str, str]], finished: list[tuple[str, str]]) -> list[Case]:
    """Hostile requests against real rollouts of the run: another rollout's token on a RUNNING
    attempt's gateway and events (403), and events/gateway calls on finished attempts (409)."""
    cases: list[Case] = []
    chat = _j({"messages": [{"role": "user", "content": "steal a turn"}]})
    if len(running) >= 2:
        (arid, aaid), (brid, baid) = random.sample(running, 2)
        stolen = _auth(attempt_token(key, arid, aaid))
        cases.append(Case("cross-rollout gateway call", "POST",
                          f"/v1/rollouts/{brid}/attempts/{baid}/v1/chat/completions", 403, stolen, chat, "forbidden"))
        cases.append(Case("cross-rollout reward", "POST", f"/v1/rollouts/{brid}/attempts/{baid}/events", 403, stolen,
                          _j({"event_type": "reward", "data": {"value": 1.0}}), "forbidden"))
    if finished:
        frid, faid = random.choice(finished)
        own = _auth(attempt_token(key, frid, faid))
        cases.append(Case("reward for a finished rollout", "POST", f"/v1/rollouts/{frid}/attempts/{faid}/events", 409,
                          own, _j({"event_type": "reward", "data": {"value": 0.5}}), "conflict"))
        cases.append(Case("gateway call for a finished rollout", "POST",
                          f"/v1/rollouts/{frid}/attempts/{faid}/v1/chat/completions", 409, own, chat,
                          "attempt_not_running"))
    return cases


def send(http: httpx.Client, case: Case) -> Outcome:
    try:
        resp = http.request(case.method, case.path, headers=case.headers, content=case.body)
    except httpx.HTTPError:
        return Outcome(case, 0, None, False)
    code = None
    try:
        payload = resp.json()
        if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
            code = payload["error"].get("code")
    except ValueError:
        pass
    ok = resp.status_code == case.expect and (case.code is None or code == case.code)
    return Outcome(case, resp.status_code, code, ok)


class HostileClient(threading.Thread):
    """Sends hostile requests in a loop until stopped; answers from a server that is down or
    starting (no answer, 503 ``starting``) are counted as skipped, not as right or wrong."""

    def __init__(self, base_url: Callable[[], str], key: str, decoy: tuple[str, str], finished: tuple[str, str],
                 live: Callable[[], tuple[list[tuple[str, str]], list[tuple[str, str]]]] | None = None,
                 pause_s: float = 0.02) -> None:
        super().__init__(name="hostile-client", daemon=True)
        self.base_url = base_url
        self.key = key
        self.static = static_cases(key, decoy, finished)
        self.live = live
        self.pause_s = pause_s
        self.outcomes: list[Outcome] = []
        self.skipped = 0
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        self.join(30)

    def run(self) -> None:
        rounds = 0
        while not self._halt.is_set():
            cases = list(self.static)
            if self.live is not None:
                try:
                    cases += live_cases(self.key, *self.live())
                except Exception:  # the live lists come from the server, which may be restarting
                    pass
            with httpx.Client(base_url=self.base_url(), timeout=30) as http:
                for case in cases:
                    if self._halt.is_set():
                        break
                    outcome = send(http, case)
                    if outcome.status == 0 or (outcome.status == 503 and outcome.code == "starting"):
                        self.skipped += 1
                    else:
                        self.outcomes.append(outcome)
                    self._halt.wait(self.pause_s)
            rounds += 1

    def summary(self) -> dict[str, Any]:
        wrong = [o for o in self.outcomes if not o.ok]
        by_expect = Counter(o.case.expect for o in self.outcomes)
        return {
            "requests": len(self.outcomes),
            "right": len(self.outcomes) - len(wrong),
            "wrong": [f"{o.case.name}: want {o.case.expect} {o.case.code or ''}, got {o.status} {o.code}"
                      for o in wrong][:20],
            "by_status": dict(sorted(by_expect.items())),
            "kinds": len({o.case.name for o in self.outcomes}),
            "skipped_server_down": self.skipped,
        }


# ------------------------------------------------------------------------------------------------
# The run: rows with planned faults
# ------------------------------------------------------------------------------------------------

#: kind -> (question suffix or stub/proxy marker, expected (state, reason or None), reward expected)
PLANNED: dict[str, tuple[str, tuple[str, str | None]]] = {
    "model-500": ("[stub:error500]", ("FAILED", "model_unreachable")),
    "model-timeout": ("[stub:hang=120]", ("FAILED", "*")),  # model_unreachable or timeout, depending on timing
    "model-garbage-body": ("[fault:garbage]", ("FAILED", "model_unreachable")),
    "model-bad-tool-json": ("[stub:badjson]", ("SUCCEEDED", None)),
    "reflection-tool-call": ("[fault:reflect-tool]", ("SUCCEEDED", None)),
    "answer-import": ("[fault:answer=import]", ("SUCCEEDED", None)),
    "answer-eval": ("[fault:answer=eval]", ("SUCCEEDED", None)),
    "answer-9**9**9": ("[fault:answer=power]", ("SUCCEEDED", None)),
    "answer-10MB": ("[fault:answer=huge]", ("SUCCEEDED", None)),
    "calculator-hang-9**9**8": ("", ("FAILED", "calculator_failed")),
    "calculator-killed-mid-call": ("", ("FAILED", "calculator_failed")),
    "agent-killed-mid-rollout": ("[stub:slow=3]", ("FAILED", "crash")),
}
PLANNED.update({f"question-{name}": ("", ("SUCCEEDED", None)) for name in HOSTILE_QUESTION_SUFFIXES})
PLANNED.update({f"question-{name}": ("", ("FAILED", "bad_environment")) for name in UNCARRIABLE_QUESTION_SUFFIXES})
HANG_EXPRESSION = "9**9**8"
#: (fraction of rollouts terminal, process fault)
DEFAULT_SCHEDULE = [(0.10, "second-controller-start"), (0.22, "server-sigterm"), (0.38, "controller-restart"),
                    (0.55, "server-sigkill"), (0.70, "second-controller-stop")]
RETRIABLE_KINDS = {"clean"} | {f"question-{n}" for n in HOSTILE_QUESTION_SUFFIXES}
#: Failures a process fault (controller killed or stopped) causes to whatever was running.
COLLATERAL_REASONS = {"controller_lost", "cancelled", "reward_post_failed"}  # + a server restart under an agent


def should_retry(kind: str, rollout: Any) -> bool:
    """What the driver retries, as a trainer would: any infrastructure failure of a row that
    should succeed; a planned-fault row only when a process fault got in its way."""
    if rollout.state != "FAILED" or len(rollout.attempts) >= rollout.max_attempts:
        return False
    return kind in RETRIABLE_KINDS or rollout.attempts[-1].reason in COLLATERAL_REASONS


def decisive_attempt(rollout: Any) -> Any:
    """The first attempt that was not cut short by a process fault (else the last one)."""
    for a in rollout.attempts:
        if not (a.state == "FAILED" and a.reason in COLLATERAL_REASONS):
            return a
    return rollout.attempts[-1]


@dataclass
class Plan:
    specs: list[dict[str, Any]]
    kind: dict[str, str]  # rid -> kind
    questions: dict[str, str]  # rid -> exact question text
    script: Path


def build_plan(n: int, workdir: Path, seed: int = 7, prefix: str = "f", deadline_s: float = 45.0,
               kinds_each: int = 2, kinds: Iterable[str] | None = None) -> Plan:
    """N rollouts: each planned kind (all, or ``kinds``) ``kinds_each`` times, spread evenly,
    the rest clean rows."""
    from calcx.data.generator import generate_split
    from calcx.data.io import write_jsonl

    rows = generate_split("train", n, seed=seed)
    planned = [k for k in (PLANNED if kinds is None else kinds) for _ in range(kinds_each)]
    if len(planned) > n:
        raise SystemExit(f"--n {n} is too small for {len(planned)} planned faults")
    slots = {round((i + 0.5) * n / len(planned)): k for i, k in enumerate(planned)}
    kinds = [slots.get(i, "clean") for i in range(n)]
    script_rows: list[dict[str, Any]] = []
    specs, kind_of, questions = [], {}, {}
    for i, (row, kind) in enumerate(zip(rows, kinds)):
        rid = f"{prefix}-{i:04d}-{kind}".replace("*", "x")
        row = dict(row)
        marker = PLANNED.get(kind, ("", None))[0]
        if kind.startswith("question-"):
            name = kind.removeprefix("question-")
            suffix = HOSTILE_QUESTION_SUFFIXES.get(name) or UNCARRIABLE_QUESTION_SUFFIXES[name]
            row["question"] = f"{row['question']}\n\n{suffix}"
        elif kind in ("calculator-hang-9**9**8", "calculator-killed-mid-call"):
            row["question"] = f"{row['question']} (case {i})"
            script_rows.append({"question": row["question"], "expression": HANG_EXPRESSION})
        elif marker:
            row["question"] = f"{row['question']}\n\n{marker}"
        specs.append({"rollout_id": rid, "group_id": f"{prefix}-g{i // 4}", "row": row, "deadline_s": deadline_s,
                      "max_attempts": 3})
        kind_of[rid] = kind
        questions[rid] = row["question"]
    script = workdir / "rows.jsonl"
    write_jsonl(rows, script)
    extra = workdir / "hang-script.jsonl"
    extra.write_text("".join(json.dumps(r) + "\n" for r in script_rows))
    return Plan(specs, kind_of, questions, extra)


# ------------------------------------------------------------------------------------------------
# Processes: finding agents and calculators under a controller
# ------------------------------------------------------------------------------------------------

STARTED_RE = re.compile(r"started (\S+)/(\S+) pid (\d+)")


def started_lines(log_paths: Iterable[Path]) -> list[tuple[str, str, int, str]]:
    """(rid, aid, pid, log name) for every agent start the controllers logged."""
    out = []
    for path in log_paths:
        try:
            text = Path(path).read_text(errors="replace")
        except OSError:
            continue
        for m in STARTED_RE.finditer(text):
            out.append((m.group(1), m.group(2), int(m.group(3)), Path(path).name))
    return out


def _fd_target(pid: int, fd: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None


def _fd_targets(pid: int) -> set[str]:
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return set()
    return {t for t in (_fd_target(pid, int(n)) for n in names) if t and t.startswith("pipe:")}


def calculator_of_agent(controller_pid: int, agent_pid: int) -> int | None:
    """The calculator process serving ``agent_pid``: a ``calcx-calc`` below the controller whose
    stdin is a pipe the agent holds the other end of (the MCP stdio transport)."""
    agent_pipes = _fd_targets(agent_pid)
    if not agent_pipes:
        return None
    for pid in descendants(controller_pid):
        if process_name(pid) == "calcx-calc" and _fd_target(pid, 0) in agent_pipes:
            return pid
    return None


def kill_if_below(root_pid: int, pid: int, comm: str, sig: int = signal.SIGKILL) -> bool:
    """Signal ``pid`` only if it is still a descendant of ``root_pid`` with the expected name."""
    if pid in descendants(root_pid) and process_name(pid) == comm:
        try:
            os.kill(pid, sig)
            return True
        except ProcessLookupError:
            return False
    return False


# ------------------------------------------------------------------------------------------------
# Audit
# ------------------------------------------------------------------------------------------------

AGENT_FINISHED_RE = re.compile(r"calcx-agent: finished reward=(\S+)")


def all_rollouts(client: Any, prefix: str | None = None) -> list[Any]:
    out, offset = [], 0
    while True:
        page = client.list_rollouts(limit=1000, offset=offset)
        out.extend(page)
        if len(page) < 1000:
            break
        offset += 1000
    return [r for r in out if prefix is None or r.rollout_id.startswith(prefix + "-")]


def agent_rewards(log_dirs: Iterable[Path]) -> dict[tuple[str, str], float]:
    """(rid, aid) -> the reward each agent said it posted (from its own output)."""
    out: dict[tuple[str, str], float] = {}
    for d in log_dirs:
        if not Path(d).is_dir():
            continue
        for path in Path(d).glob("*.log"):
            if path.name == "zygote.log":
                continue
            rid, _, aid = path.stem.rpartition(".")
            m = None
            for m in AGENT_FINISHED_RE.finditer(path.read_text(errors="replace")):
                pass
            if m is not None:
                out[(rid, aid)] = float(m.group(1))
    return out


def audit(rollouts: list[Any], kind_of: dict[str, str], starts: list[tuple[str, str, int, str]],
          posted: dict[tuple[str, str], float], questions: dict[str, str] | None = None,
          calls: Callable[[str, str], list[Any]] | None = None) -> dict[str, Any]:
    """Everything the run promises, checked against the store."""
    by_id = {r.rollout_id: r for r in rollouts}
    lost = sorted(set(kind_of) - set(by_id)) + sorted(r.rollout_id for r in rollouts
                                                       if r.rollout_id in kind_of and not r.is_terminal)
    start_count = Counter((rid, aid) for rid, aid, _, _ in starts)
    duplicates = sorted(f"{rid}/{aid} x{n}" for (rid, aid), n in start_count.items() if n > 1)
    failed_without_reason, succeeded_without_reward, reward_mismatch = [], [], []
    unexpected: list[str] = []
    masked: list[str] = []
    reasons: Counter[str] = Counter()
    planned_outcomes: dict[str, Counter[str]] = defaultdict(Counter)
    attempts_total = 0
    for r in rollouts:
        if r.rollout_id not in kind_of:
            continue
        for a in r.attempts:
            attempts_total += 1
            if a.state == "FAILED":
                reasons[a.reason or "<none>"] += 1
                if not a.reason:
                    failed_without_reason.append(f"{r.rollout_id}/{a.attempt_id}")
            key = (r.rollout_id, a.attempt_id)
            if key in posted:
                stored = [e.data.get("value") for e in r.events if e.attempt_id == a.attempt_id
                          and e.event_type == "reward"]
                if not stored or stored[-1] != posted[key]:
                    reward_mismatch.append(f"{r.rollout_id}/{a.attempt_id}: agent posted {posted[key]}, store {stored}")
        if r.state == "SUCCEEDED" and r.reward is None:
            succeeded_without_reward.append(r.rollout_id)
        kind = kind_of[r.rollout_id]
        # rows that should succeed are judged by their last attempt (retried after collateral
        # failures); planned faults by the first attempt no process fault cut short
        first = r.attempts[-1] if kind in RETRIABLE_KINDS else decisive_attempt(r)
        outcome = first.state if first.state != "FAILED" else f"FAILED {first.reason}"
        planned_outcomes[kind][outcome] += 1
        if kind in PLANNED:
            want_state, want_reason = PLANNED[kind][1]
            if first.state == "FAILED" and first.reason in COLLATERAL_REASONS:
                masked.append(f"{r.rollout_id}: every attempt ended {first.reason}")
            elif first.state != want_state or (want_reason not in (None, "*") and first.reason != want_reason):
                unexpected.append(f"{r.rollout_id}: attempt {first.attempt_id} {outcome}, planned {want_state} "
                                  f"{want_reason or ''}")
            if want_state == "FAILED" and first.state == "SUCCEEDED":
                unexpected.append(f"{r.rollout_id}: infrastructure fault ended SUCCEEDED reward {r.reward}")
            if kind.startswith("answer-") and first.state == "SUCCEEDED" and r.reward != 0.0:
                unexpected.append(f"{r.rollout_id}: hostile answer scored {r.reward}")
    not_started = [f"{r.rollout_id}/{a.attempt_id}" for r in rollouts if r.rollout_id in kind_of
                   for a in r.attempts if a.state == "SUCCEEDED" and start_count[(r.rollout_id, a.attempt_id)] == 0]
    text_mismatch: list[str] = []
    from calcx.agent.answer import build_task

    if questions and calls:
        for rid, kind in kind_of.items():
            r = by_id.get(rid)
            if not kind.startswith("question-") or r is None:
                continue
            for a in r.attempts:
                recorded = calls(rid, a.attempt_id)
                if not recorded:
                    continue
                user = next((m for m in recorded[0].request.get("messages", []) if m.get("role") == "user"), {})
                content = user.get("content")
                if content != build_task(questions[rid]):
                    text_mismatch.append(f"{rid}/{a.attempt_id}")
    return {
        "rollouts": len(kind_of),
        "attempts": attempts_total,
        "lost": lost,
        "duplicates": duplicates,
        "succeeded_without_start": not_started,
        "failed_without_reason": failed_without_reason,
        "succeeded_without_reward": succeeded_without_reward,
        "reward_mismatch": reward_mismatch,
        "unexpected": unexpected,
        "masked_by_process_faults": masked,
        "question_text_mismatch": text_mismatch,
        "failure_reasons": dict(reasons.most_common()),
        "planned_outcomes": {k: dict(v) for k, v in planned_outcomes.items()},
        "final_states": dict(Counter(by_id[rid].state for rid in kind_of if rid in by_id)),
    }


# ------------------------------------------------------------------------------------------------
# Driver
# ------------------------------------------------------------------------------------------------


class HangWatch(threading.Thread):
    """Flags attempts still RUNNING well past their deadline (a hang the system did not end)."""

    def __init__(self, client_factory: Callable[[], Any], slack_s: float = 30.0) -> None:
        super().__init__(name="hang-watch", daemon=True)
        self.client_factory = client_factory
        self.slack_s = slack_s
        self.hung: set[str] = set()
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(1.0):
            try:
                with self.client_factory() as c:
                    for r in c.list_rollouts(state="RUNNING", limit=1000):
                        a = r.attempts[-1]
                        if a.started_at and time.time() - a.started_at > r.deadline_s + self.slack_s:
                            self.hung.add(f"{r.rollout_id}/{a.attempt_id}")
            except Exception:
                continue

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


@dataclass
class Event:
    kind: str
    at: float  # wall clock
    target: str = ""
    up_at: float | None = None  # when the restarted process was ready again
    note: str = ""


class Injector(threading.Thread):
    """Acts on the running stack: row-targeted kills, and process faults at progress points."""

    def __init__(self, stack: Any, plan: Plan, progress: Callable[[], float], schedule: list[tuple[float, str]],
                 log: Callable[[str], None]) -> None:
        super().__init__(name="fault-injector", daemon=True)
        self.stack = stack
        self.plan = plan
        self.progress = progress
        self.schedule = sorted(schedule)
        self.pending = list(self.schedule)
        self.log = log
        self.events: list[Event] = []
        self.errors: list[str] = []
        self._halt = threading.Event()
        self._done_kill: set[str] = set()
        self.orphans: list[str] = []
        self.lock = threading.Lock()

    def stop(self) -> None:
        self._halt.set()
        self.join(120)

    # -- row-targeted kills --------------------------------------------------------------
    def _controller_logs(self) -> list[Path]:
        return [p.log_path for p in self.stack.controllers]

    def _kill_targets(self) -> None:
        wanted = {"agent-killed-mid-rollout", "calculator-killed-mid-call"}
        for rid, aid, pid, log_name in started_lines(self._controller_logs()):
            kind = self.plan.kind.get(rid)
            if kind not in wanted or f"{rid}/{aid}" in self._done_kill:
                continue
            controller = next((c for c in self.stack.controllers if Path(c.log_path).name == log_name), None)
            if controller is None or not controller.alive():
                continue
            if kind == "agent-killed-mid-rollout":
                # the stub holds the model call for 3 s: the agent is certainly mid-rollout
                if kill_if_below(controller.pid, pid, "calcx-agent"):
                    self._done_kill.add(f"{rid}/{aid}")
                    self.events.append(Event("agent killed (SIGKILL)", time.time(), f"{rid}/{aid} pid {pid}"))
            else:
                calc = calculator_of_agent(controller.pid, pid)
                if calc is None or not self._computing(calc):
                    continue
                if kill_if_below(controller.pid, calc, "calcx-calc"):
                    self._done_kill.add(f"{rid}/{aid}")
                    self.events.append(Event("calculator killed mid-call (SIGKILL)", time.time(),
                                             f"{rid}/{aid} pid {calc}"))

    @staticmethod
    def _computing(pid: int) -> bool:
        """True once the calculator is busy (it is evaluating 9**9**8, state R)."""
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            return fields[0] == b"R" and (int(fields[11]) + int(fields[12])) > 5
        except (OSError, ValueError, IndexError):
            return False

    # -- process faults ------------------------------------------------------------------
    def _server_restart(self, sig: int) -> None:
        name = "SIGKILL" if sig == signal.SIGKILL else "SIGTERM"
        t0 = time.time()
        self.stack.server.stop(grace_s=10.0, sig=sig)
        deadline = time.monotonic() + 60
        while True:
            try:
                self.stack.start_server(30.0)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self.events.append(Event(f"server restarted ({name})", t0, "server", time.time()))

    def _controller_restart(self) -> None:
        c0 = self.stack.controllers[0]
        tree = {pid: process_start_time(pid) for pid in descendants(c0.pid)}
        t0 = time.time()
        c0.stop(grace_s=0.1, sig=signal.SIGKILL)
        started = self.stack.start_controller(controller_id="faults-main", extra_args=self._extra)
        self.stack.controllers.remove(started)
        self.stack.controllers.insert(0, started)
        self.stack.controllers.append(c0)  # keep its log for the audit
        self.events.append(Event("controller restarted (SIGKILL)", t0, "faults-main", time.time(),
                                 note=f"new pid {started.pid}"))
        # what the killed controller had started (worker, agents, calculators) must be gone
        self.orphans += [f"{pid} {process_name(pid)}" for pid, st in tree.items()
                         if st is not None and process_start_time(pid) == st]

    _extra: list[str] = []

    def _second_controller(self, start: bool) -> None:
        t0 = time.time()
        if start:
            c = self.stack.start_controller(controller_id="faults-second", extra_args=self._extra)
            self._second = c
            self.events.append(Event("second controller started", t0, "faults-second", time.time()))
        else:
            c = getattr(self, "_second", None)
            if c is not None:
                c.stop(grace_s=20.0, sig=signal.SIGTERM)
                self.events.append(Event("second controller stopped (SIGTERM)", t0, "faults-second", time.time()))

    def schedule_left(self) -> bool:
        return bool(self.pending) and self.is_alive()

    def busy(self) -> bool:
        return self.worker is not None and self.worker.is_alive()

    def _act(self, action: str) -> None:
        try:
            if action == "server-sigterm":
                self._server_restart(signal.SIGTERM)
            elif action == "server-sigkill":
                self._server_restart(signal.SIGKILL)
            elif action == "controller-restart":
                self._controller_restart()
            elif action == "second-controller-start":
                self._second_controller(True)
            elif action == "second-controller-stop":
                self._second_controller(False)
        except Exception as exc:  # keep going; the audit shows what happened
            self.errors.append(f"{action}: {type(exc).__name__}: {exc}")

    worker: threading.Thread | None = None

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self._kill_targets()
            except Exception as exc:
                self.errors.append(f"kill: {type(exc).__name__}: {exc}")
            if not self.busy() and self.pending and self.progress() >= self.pending[0][0]:
                _, action = self.pending.pop(0)
                self.log(f"fault: {action} at {self.progress():.0%}")
                self.worker = threading.Thread(target=self._act, args=(action,), name=f"fault-{action}", daemon=True)
                self.worker.start()
            self._halt.wait(0.05)
        if self.worker is not None:
            self.worker.join(90)


def recovery_times(events: list[Event], attempts: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """For each restart: seconds until the process was back, and until the next claim and the
    next SUCCEEDED finish after it was back (from the store's timestamps)."""
    out = []
    for ev in events:
        if ev.up_at is None or "second controller" in ev.kind:
            continue
        by = ev.target if ev.target.startswith("faults-") else None
        claims = [a.started_at for cid, a in attempts if a.started_at and a.started_at > ev.up_at
                  and (by is None or cid == by)]
        finishes = [a.finished_at for cid, a in attempts if a.finished_at and a.finished_at > ev.up_at
                    and a.state == "SUCCEEDED" and (by is None or cid == by)]
        out.append({
            "fault": ev.kind,
            "back_s": ev.up_at - ev.at,
            "next_claim_s": (min(claims) - ev.at) if claims else None,
            "next_success_s": (min(finishes) - ev.at) if finishes else None,
        })
    return out


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, max(0, int(round(q * (len(values) - 1)))))]


def make_stack(workdir: Path, plan_script: Path, rows_script: Path, concurrency: int, lease_s: float,
               upstream_timeout_s: float, calculator_timeout_s: float, agent_timeout_s: float) -> Any:
    from calcx.rehearse.stack import StackConfig, Stack

    config = StackConfig(
        workdir=workdir, key=KEY, concurrency=concurrency, agent_logs=True,
        script_files=[str(rows_script), str(plan_script)],
        server_args=["--lease-s", str(lease_s), "--max-body-bytes", str(MAX_BODY_BYTES),
                     "--upstream-timeout-s", str(upstream_timeout_s), "--upstream-retries", "2"],
        controller_env={"CALCX_CALCULATOR_TIMEOUT_S": str(calculator_timeout_s),
                        "CALCX_AGENT_TIMEOUT_S": str(agent_timeout_s)},
    )
    return Stack(config)


def start_proxy(stack: Any, canary: Path) -> Any:
    from calcx.rehearse.stack import ManagedProcess, _python_env

    cmd = [stack.config.python, str(Path(__file__).resolve()), "proxy", "--upstream", stack.stub_url,
           "--canary", str(canary)]
    proc = ManagedProcess("fault-proxy", cmd, stack.workdir / "proxy.log", _python_env())
    proc.start(re.compile(r"serving on (http://\S+)"), 60)
    return proc


class DecoyKeeper(threading.Thread):
    """Heartbeats the hostile client's RUNNING decoy so that its lease never lapses."""

    def __init__(self, base_url: Callable[[], str], key: str, decoy: tuple[str, str], period_s: float = 1.0) -> None:
        super().__init__(name="decoy-keeper", daemon=True)
        self.base_url, self.key, self.decoy, self.period_s = base_url, key, decoy, period_s
        self._halt = threading.Event()

    def run(self) -> None:
        from calcx.api.client import CalcxAPIError, CalcxClient

        while not self._halt.wait(self.period_s):
            try:
                with CalcxClient(self.base_url(), self.key, timeout=10) as c:
                    c.heartbeat("hostile-client", [self.decoy])
            except CalcxAPIError:
                pass

    def stop(self) -> None:
        self._halt.set()
        self.join(15)


def decoy_attempts(client: Any, prefix: str) -> tuple[tuple[str, str], tuple[str, str]]:
    """Two rollouts the hostile client owns (claimed before any controller runs): one kept
    RUNNING, one finished FAILED."""
    row = {"question": "decoy", "result": "0"}
    client.create_rollouts([{"rollout_id": f"{prefix}-decoy-running", "row": row, "deadline_s": 3600},
                            {"rollout_id": f"{prefix}-decoy-finished", "row": row, "deadline_s": 3600}])
    claims = client.claim("hostile-client", max=2, timeout_s=0).claims
    ids = {c.rollout.rollout_id: c.attempt_id for c in claims}
    running = (f"{prefix}-decoy-running", ids[f"{prefix}-decoy-running"])
    finished = (f"{prefix}-decoy-finished", ids[f"{prefix}-decoy-finished"])
    client.finish(*finished, "FAILED", reason="cancelled", detail="decoy of the hostile client")
    return running, finished


def run_faults(args: argparse.Namespace, workdir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    from calcx.api.client import CalcxAPIError, CalcxClient

    plan = build_plan(args.n, workdir, deadline_s=args.deadline_s, kinds_each=args.kinds_each,
                      kinds=getattr(args, "kinds", None))
    canary = workdir / CANARY_NAME
    stack = make_stack(workdir, plan.script, workdir / "rows.jsonl", args.concurrency, args.lease_s,
                       args.upstream_timeout_s, args.calculator_timeout_s, args.agent_timeout_s)
    result: dict[str, Any] = {}
    proxy = None
    threads: list[Any] = []
    t_start = time.time()
    try:
        stack.start_server()
        stack.start_stub()
        proxy = start_proxy(stack, canary)
        assert proxy.match is not None
        with CalcxClient(stack.server_url, KEY) as c:
            c.put_models(stack.config.model_name, [proxy.match.group(1)])
            decoy, finished = decoy_attempts(c, "f")
        keeper = DecoyKeeper(lambda: stack.server_url, KEY, decoy)
        keeper.start()
        threads.append(keeper)
        stack.start_controller(controller_id="faults-main")
        log(f"stack up in {time.time() - t_start:.1f}s: server {stack.server_url}")

        def client() -> CalcxClient:
            return CalcxClient(stack.server_url, KEY, timeout=30)

        progress_state = {"terminal": 0, "running": [], "finished": []}

        def progress() -> float:
            return progress_state["terminal"] / len(plan.specs)

        def live() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
            return progress_state["running"], progress_state["finished"]

        hostile = HostileClient(lambda: stack.server_url, KEY, decoy, finished, live)
        hang = HangWatch(client)
        schedule = getattr(args, "schedule", None) or DEFAULT_SCHEDULE
        injector = Injector(stack, plan, progress, schedule, log)
        threads += [hostile, hang, injector]

        with client() as c:
            c.create_rollouts(plan.specs)
        t_submit = time.time()
        log(f"submitted {len(plan.specs)} rollouts")
        for t in (hostile, hang, injector):
            t.start()
        # Drive: keep the decoy alive, retry collateral infra failures of clean rows (a trainer's
        # job), stop when every rollout is terminal and no retry is pending.
        retried: Counter[str] = Counter()
        deadline = time.monotonic() + args.timeout_s
        last_report = 0.0
        while time.monotonic() < deadline:
            try:
                with client() as c:
                    rollouts = all_rollouts(c, "f")
                    mine = [r for r in rollouts if r.rollout_id in plan.kind]
                    terminal = [r for r in mine if r.is_terminal]
                    progress_state["terminal"] = len(terminal)
                    progress_state["running"] = [(r.rollout_id, r.attempts[-1].attempt_id) for r in mine
                                                 if r.state == "RUNNING"]
                    progress_state["finished"] = [(r.rollout_id, r.attempts[-1].attempt_id) for r in terminal]
                    for r in terminal:
                        if should_retry(plan.kind[r.rollout_id], r):
                            c.retry(r.rollout_id)
                            retried[r.attempts[-1].reason or "?"] += 1
                    done = len(terminal) == len(mine) == len(plan.specs) and not any(
                        should_retry(plan.kind[r.rollout_id], r) for r in terminal)
            except CalcxAPIError:
                time.sleep(0.2)  # the server is restarting
                continue
            if time.monotonic() - last_report > 10:
                last_report = time.monotonic()
                log(f"  {len(terminal)}/{len(plan.specs)} terminal, {len(progress_state['running'])} running, "
                    f"{sum(retried.values())} retried")
            if done and not injector.schedule_left() and not injector.busy():
                break
            time.sleep(0.5)
        t_end = time.time()
        for t in threads:
            t.stop()
        with client() as c:
            rollouts = all_rollouts(c, "f")
            calls = lambda rid, aid: c.calls(rid, attempt_id=aid)  # noqa: E731
            posted = agent_rewards(sorted(workdir.glob("agents-*")))
            starts = started_lines(sorted(workdir.glob("controller-*.log")))
            report = audit(rollouts, plan.kind, starts, posted, plan.questions, calls)
        attempts = [(a.controller_id, a) for r in rollouts for a in r.attempts]
        result = {
            "audit": report,
            "retried": dict(retried),
            "hostile": hostile.summary(),
            "hangs": sorted(hang.hung),
            "events": [ev.__dict__ for ev in injector.events],
            "injector_errors": injector.errors,
            "orphans": injector.orphans,
            "recovery": recovery_times(injector.events, attempts),
            "canary_exists": canary.exists() or any(Path("/tmp").glob("calcx-*-pwned")),
            "wall_s": t_end - t_submit,
            "agent_rewards_seen": len(posted),
        }
    finally:
        for t in threads:
            if t.is_alive():
                try:
                    t.stop()
                except Exception:
                    pass
        leftover_before = stack.all_pids()
        stack.stop()
        if proxy is not None:
            proxy.stop()
        time.sleep(0.5)
        result["leftover_processes"] = sorted(p for p in leftover_before if pid_alive(p))
    return result


def run_queued(args: argparse.Namespace, workdir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """N rollouts queued at once with no controller: server memory and latency, then a drain."""
    from calcx.api.client import CalcxClient
    from calcx.data.generator import generate_split
    from calcx.data.io import write_jsonl

    n = args.queued
    rows = generate_split("train", n, seed=3)
    write_jsonl(rows, workdir / "rows.jsonl")
    (workdir / "empty.jsonl").write_text("")
    stack = make_stack(workdir, workdir / "empty.jsonl", workdir / "rows.jsonl", args.concurrency, 30.0,
                       30.0, 30.0, 60.0)
    out: dict[str, Any] = {"queued": n}
    try:
        stack.start_server()
        stack.start_stub()
        stack.register_model()
        http = httpx.Client(base_url=stack.server_url, headers=_auth(KEY), timeout=60)

        def timed(method: str, path: str, body: Any = None) -> tuple[float, httpx.Response]:
            t = time.perf_counter()
            resp = http.request(method, path, content=None if body is None else _j(body))
            return time.perf_counter() - t, resp

        def latencies(count: int, method: str, path: Callable[[int], str], body: Any = None) -> list[float]:
            out_l = []
            for i in range(count):
                dt, resp = timed(method, path(i), body)
                if resp.status_code >= 400:
                    raise RuntimeError(f"{method} {path(i)}: {resp.status_code} {resp.text[:200]}")
                out_l.append(dt)
            return out_l

        rss0 = rss_bytes(stack.server.pid)
        base_health = latencies(200, "GET", lambda i: "/healthz")
        specs = [{"rollout_id": f"q-{i:05d}", "group_id": f"q-g{i // 8}", "row": row, "deadline_s": 60,
                  "max_attempts": 1} for i, row in enumerate(rows)]
        dt_create, resp = timed("POST", "/v1/rollouts", {"rollouts": specs})
        if resp.status_code != 200:
            raise RuntimeError(f"create: {resp.status_code} {resp.text[:300]}")
        rss1 = rss_bytes(stack.server.pid)
        health = latencies(300, "GET", lambda i: "/healthz")
        gets = latencies(300, "GET", lambda i: f"/v1/rollouts/q-{(i * 37) % n:05d}")
        lists = latencies(20, "GET", lambda i: "/v1/rollouts?state=QUEUED&limit=1000")
        claims = latencies(100, "POST", lambda i: "/v1/claims", {"controller_id": "latency-probe", "max": 1,
                                                                   "timeout_s": 0})
        with CalcxClient(stack.server_url, KEY) as c:
            for r in c.list_rollouts(state="RUNNING", controller_id="latency-probe", limit=1000):
                c.finish(r.rollout_id, r.attempts[-1].attempt_id, "FAILED", reason="cancelled",
                         detail="claimed only to measure claim latency")
        rss2 = rss_bytes(stack.server.pid)
        log(f"queued {n}: create {dt_create * 1000:.0f} ms; draining for {args.drain_s:.0f}s")
        stack.start_controller(controller_id="drain")
        t_drain = time.time()
        drain_health: list[float] = []
        while time.time() - t_drain < args.drain_s:
            drain_health.append(timed("GET", "/healthz")[0])
            time.sleep(0.1)
        drain_gets = latencies(100, "GET", lambda i: f"/v1/rollouts/q-{(i * 53) % n:05d}")
        with CalcxClient(stack.server_url, KEY) as c:
            done = all_rollouts(c, "q")
        rss3 = rss_bytes(stack.server.pid)
        states = Counter(r.state for r in done)
        ms = lambda xs, q: pct(xs, q) * 1000  # noqa: E731
        out.update({
            "create_ms": dt_create * 1000,
            "rss_mb": {"idle": rss0 / 2**20, "after_enqueue": rss1 / 2**20, "after_probes": rss2 / 2**20,
                       "after_drain": rss3 / 2**20},
            "latency_ms": {
                "healthz idle": (ms(base_health, .5), ms(base_health, .99)),
                "healthz, 1,000 queued": (ms(health, .5), ms(health, .99)),
                "GET rollout, 1,000 queued": (ms(gets, .5), ms(gets, .99)),
                "list 1,000 QUEUED": (ms(lists, .5), ms(lists, .99)),
                "claim (max=1)": (ms(claims, .5), ms(claims, .99)),
                "healthz while draining": (ms(drain_health, .5), ms(drain_health, .99)),
                "GET rollout while draining": (ms(drain_gets, .5), ms(drain_gets, .99)),
            },
            "drain_s": args.drain_s,
            "states_after_drain": dict(states),
            "lost": n - len(done),
        })
    finally:
        stack.stop()
    return out


def render_markdown(args: argparse.Namespace, res: dict[str, Any], queued: dict[str, Any] | None,
                    command: str) -> str:
    a = res["audit"]
    h = res["hostile"]
    rows = {k: sum(v.values()) for k, v in a["planned_outcomes"].items() if k != "clean"}
    process: Counter[str] = Counter(ev["kind"] for ev in res["events"])
    lines = [
        "# Faults and hostile inputs: what calcx survives",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} on this machine "
        f"({os.cpu_count()} CPU cores, shared with other work; {platform.machine()}, Python "
        f"{platform.python_version()}). Command:",
        "",
        "```",
        command,
        "```",
        "",
        f"Settings: {getattr(args, 'concurrency', '?')} rollouts at once per controller, rollout deadline "
        f"{getattr(args, 'deadline_s', '?')} s, server lease {getattr(args, 'lease_s', '?')} s, "
        f"gateway upstream timeout {getattr(args, 'upstream_timeout_s', '?')} s with 2 retries, "
        f"agents' calculator timeout {getattr(args, 'calculator_timeout_s', '?')} s and whole-run bound "
        f"{getattr(args, 'agent_timeout_s', '?')} s (lowered so that hangs end fast), model client retries at "
        "their default (6).",
        "",
        "## Figures",
        "",
        "| figure | value | target |",
        "|---|---|---|",
        f"| rollouts in the run (submitted at once) | {a['rollouts']} ({a['attempts']} attempts) | >= 200 |",
        f"| faults and hostile inputs injected | {sum(rows.values())} rows of {len(rows)} kinds + "
        f"{sum(process.values())} process faults of {len(process)} kinds | every kind of the issue |",
        f"| rollouts lost (not terminal or missing) | {len(a['lost'])} | 0 |",
        f"| rewards lost (SUCCEEDED without reward; agent-posted reward missing) | "
        f"{len(a['succeeded_without_reward'])}; {len(a['reward_mismatch'])} | 0; 0 |",
        f"| duplicate runs (an attempt started twice) | {len(a['duplicates'])} | 0 |",
        f"| hangs (RUNNING > deadline + 30 s, or never terminal) | {len(res['hangs'])} | 0 |",
        f"| FAILED attempts without a reason | {len(a['failed_without_reason'])} | 0 |",
        f"| planned faults that ended otherwise than planned | {len(a['unexpected'])} | 0 |",
        f"| infrastructure faults that ended SUCCEEDED (silent reward 0) | "
        f"{sum(1 for u in a['unexpected'] if 'ended SUCCEEDED' in u)} | 0 |",
        f"| hostile question texts that reached the agent changed | {len(a['question_text_mismatch'])} | 0 |",
        f"| hostile answers executed (canary file created) | {int(bool(res['canary_exists']))} | 0 |",
        f"| bad requests answered with the right status and code | {h['right']}/{h['requests']} "
        f"({h['kinds']} kinds) | all |",
        f"| processes of a SIGKILLed controller alive after its restart | {len(res.get('orphans', []))} | 0 |",
        f"| processes left after shutdown | {len(res['leftover_processes'])} | 0 |",
        f"| wall time of the run (submit to last terminal) | {res['wall_s']:.1f} s | |",
        "",
        "## Row faults and hostile inputs",
        "",
        "Each row carries its fault (a stub or proxy marker, a hanging calculator expression, a hostile "
        "text) or is the target of a kill. A planned fault is judged by its first attempt that no process "
        "fault cut short; rows that should succeed by their last attempt.",
        "",
        "| rows | count | ended | planned |",
        "|---|---|---|---|",
    ]
    for kind, count in sorted(rows.items()):
        outcome = ", ".join(f"{o} x{n}" for o, n in sorted(a["planned_outcomes"][kind].items()))
        want = PLANNED[kind][1]
        planned = f"{want[0]}{' ' + want[1] if want[1] and want[1] != '*' else ''}"
        if want[1] == "*":
            planned += " (timeout or model_unreachable)"
        elif kind.startswith("answer-") or kind in ("model-bad-tool-json", "reflection-tool-call"):
            planned += ", reward 0"
        lines.append(f"| {kind} | {count} | {outcome} | {planned} |")
    lines += ["", "## Process faults", "", "| fault | count |", "|---|---|"]
    lines += [f"| {kind} | {count} |" for kind, count in sorted(process.items())]
    lines += ["", f"Clean rows ({sum(a['planned_outcomes'].get('clean', {}).values())}) ended (after retries): "
              f"{', '.join(f'{o} x{n}' for o, n in sorted(a['planned_outcomes'].get('clean', {}).items()))}.",
              f"Collateral infrastructure failures of clean and hostile-question rows were retried as a trainer "
              f"would ({', '.join(f'{k} x{v}' for k, v in sorted(res['retried'].items())) or 'none'}); final "
              f"states: {', '.join(f'{k} {v}' for k, v in sorted(a['final_states'].items()))}.",
              f"FAILED attempts by reason: {', '.join(f'{k} {v}' for k, v in a['failure_reasons'].items())}.",
              "", "## Recovery after restarts", "",
              "| fault | process back after | next claim after | next SUCCEEDED finish after |", "|---|---|---|---|"]
    fmt = lambda v: "-" if v is None else f"{v:.1f} s"  # noqa: E731
    for r in res["recovery"]:
        lines.append(f"| {r['fault']} | {fmt(r['back_s'])} | {fmt(r['next_claim_s'])} | {fmt(r['next_success_s'])} |")
    lines += ["", "Times are from the fault (signal sent) to the event; claims and finishes come from the store's "
              "timestamps (the restarted controller's own, for a controller restart).", "",
              "## Hostile client", "",
              f"{h['requests']} requests of {h['kinds']} kinds during the run (wrong or missing keys on every "
              "endpoint, forged and other attempts' tokens, malformed, oversized and unknown events, events and "
              "gateway calls for unknown and finished rollouts, cross-rollout gateway calls, bad bodies and "
              f"queries); expected statuses {', '.join(f'{k} x{v}' for k, v in h['by_status'].items())}. "
              f"{h['skipped_server_down']} requests got no answer while the server was restarting (not counted).",
              ""]
    if h["wrong"]:
        lines += ["Wrong answers:", ""] + [f"- {w}" for w in h["wrong"]] + [""]
    problems = {k: a[k] for k in ("lost", "duplicates", "failed_without_reason", "succeeded_without_reward",
                                  "reward_mismatch", "unexpected", "question_text_mismatch") if a[k]}
    if problems or res["hangs"] or res["injector_errors"] or res.get("orphans"):
        lines += ["## Problems found", "", "```", json.dumps({**problems, "hangs": res["hangs"],
                                                              "injector_errors": res["injector_errors"],
                                                              "orphans": res.get("orphans")}, indent=1)[:6000],
                  "```", ""]
    if queued:
        q = queued
        lines += [f"## {q['queued']:,} rollouts queued at once", "",
                  f"No controller running; one `POST /v1/rollouts` of {q['queued']:,} rollouts took "
                  f"{q['create_ms']:.0f} ms. Server RSS: idle {q['rss_mb']['idle']:.0f} MB, after the enqueue "
                  f"{q['rss_mb']['after_enqueue']:.0f} MB, after the probes {q['rss_mb']['after_probes']:.0f} MB, "
                  f"after {q['drain_s']:.0f} s of draining {q['rss_mb']['after_drain']:.0f} MB.", "",
                  "| request | p50 | p99 |", "|---|---|---|"]
        for name, (p50, p99) in q["latency_ms"].items():
            lines.append(f"| {name} | {p50:.1f} ms | {p99:.1f} ms |")
        lines += ["", f"After {q['drain_s']:.0f} s with one controller: "
                  f"{', '.join(f'{k} {v}' for k, v in sorted(q['states_after_drain'].items()))} "
                  f"(100 FAILED `cancelled` are the claim-latency probes); lost: {q['lost']}.", ""]
    lines += ["## How the faults are made", "", "See [docs/faults.md](../docs/faults.md).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "proxy":
        return proxy_main(argv[1:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=200, help="rollouts in the fault run (default 200)")
    p.add_argument("--kinds-each", type=int, default=2, help="rows per planned fault kind (default 2)")
    p.add_argument("--concurrency", type=int, default=12, help="per controller (default 12)")
    p.add_argument("--deadline-s", type=float, default=45.0, help="rollout deadline (default 45)")
    p.add_argument("--lease-s", type=float, default=6.0, help="server lease (default 6, shorter than the server's 30 s so that controller restarts recover fast)")
    p.add_argument("--upstream-timeout-s", type=float, default=4.0, help="gateway upstream timeout (default 4)")
    p.add_argument("--calculator-timeout-s", type=float, default=6.0, help="agents' MCP read timeout (default 6)")
    p.add_argument("--agent-timeout-s", type=float, default=35.0, help="agents' whole-run bound (default 35)")
    p.add_argument("--timeout-s", type=float, default=420.0, help="give up the fault run after this long")
    p.add_argument("--queued", type=int, default=0, help="also queue this many rollouts at once (e.g. 1000)")
    p.add_argument("--drain-s", type=float, default=20.0, help="how long a controller drains the queue")
    p.add_argument("--workdir", default=None, help="keep logs and databases here")
    p.add_argument("--write", action="store_true", help="write benchmarks/FAULTS.md")
    p.add_argument("--json", action="store_true", help="print the raw results as JSON")
    args = p.parse_args(argv)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    base = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="calcx-faults-"))
    base.mkdir(parents=True, exist_ok=True)
    (base / "run").mkdir(exist_ok=True)
    t0 = time.time()
    res = run_faults(args, base / "run", log)
    queued = None
    if args.queued:
        (base / "queued").mkdir(exist_ok=True)
        queued = run_queued(args, base / "queued", log)
    command = "PYTHONPATH=src/python /opt/calcx-dev/bin/python benchmarks/faults.py " + " ".join(argv)
    text = render_markdown(args, res, queued, command.strip())
    if args.json:
        print(json.dumps({"faults": res, "queued": queued}, indent=1, default=str))
    else:
        print(text)
    log(f"total {time.time() - t0:.0f}s; logs in {base}")
    if args.write:
        (ROOT / "benchmarks" / "FAULTS.md").write_text(text)
    a = res["audit"]
    bad = (a["lost"] or a["duplicates"] or a["failed_without_reason"] or a["succeeded_without_reward"]
           or a["reward_mismatch"] or res["hangs"] or res["hostile"]["wrong"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
