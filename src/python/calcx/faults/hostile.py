"""Hostile inputs and a hostile HTTP client.

Question texts that break YAML, JSON, shells and templates (they must reach the agent byte
for byte), texts no process environment can carry, final answers the reward must survive, and
requests to every endpoint with wrong or missing keys, malformed, oversized, too deeply nested
and unknown bodies, out-of-range rewards, gateway fields that would change what the policy
samples, ids the server cannot read, writes for a run another trainer holds the lease of, and an
event flood past the per-attempt cap, each with the status and error code the server must answer."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from calcx.api.tokens import attempt_token
from calcx.contract.env import CALCX_CALCULATOR_CMD
from calcx.contract.failures import FailureReason

KEY = "calcx-faults-key-0123456789-abcdefgh"  # the server key of the fault run and of the tests
MAX_BODY_BYTES = 1024 * 1024  # the server runs with this --max-body-bytes (oversized = above it)
MAX_EVENT_BODY_BYTES = 16 * 1024  # ... and this --max-event-body-bytes (an oversized event: above it)
#: The server runs with this --max-events-per-attempt: the hostile client's event flood on its
#: decoy attempt reaches it within a run, and every event past it must get 413 attempt_limit.
MAX_EVENTS_PER_ATTEMPT = 40
FLOOD_EVENTS = 25  # flood events per pass of the hostile client
#: A run whose lease the fault run's setup takes for another trainer (calcx.faults.run.decoy_attempts):
#: the hostile client's writes for it, under its own owner id, must be refused (409 lease_lost).
LEASED_RUN = "faults-leased-run"
LEASE_HOLDER = "faults-lease-holder"


#: Question texts built to break YAML, JSON, shells and templates. Each is appended (as its own
#: paragraph) to a real question, so the stub still finds the arithmetic and the rollout should
#: succeed; the agent must receive the whole text exactly.
HOSTILE_QUESTION_SUFFIXES: dict[str, str] = {
    "yaml-structure": "key: value\n---\n- item\n? complex\n: mapping\n\"quoted\": 'single'\n# comment\n...",
    "yaml-tags": "!!python/object/apply:os.system ['touch /tmp/calcx-yaml-pwned'] &anchor *anchor !Ref x",
    "json-breakers": '"}], "rollout_id": "evil", "x": {"\\u0000\\\\" \\n \u2028\u2029 {{"a":1}}',
    "shell": "$(touch /tmp/calcx-shell-pwned) `id` ; rm -rf / && echo $HOME | cat /etc/passwd > /dev/null 2>&1 &",
    "template": "{{ 7*7 }} {% if true %}x{% endif %} ${jndi:ldap://x} %(name)s {0} <script>alert(1)</script>",
    "unicode": "Ω≈ç√∫ 😀 \u202eevil\u202c \ufeff zero\u200bwidth \U0001f4a9 e\u0301 ﷽ \t\r\n\x0b\x0c",
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
    #: another right answer (status, code): a flood event once the attempt holds its cap
    alt: tuple[int, str] | None = None


@dataclass
class Outcome:
    case: Case
    status: int  # 0: no answer (connection refused or dropped)
    code: str | None
    ok: bool
    sent_at: float = 0.0  # wall clock, to match against the server's restarts
    answered_at: float = 0.0

    @property
    def unanswered(self) -> bool:
        """No answer, or the server's 503 ``starting`` (its store is not open yet, or no longer)."""
        return self.status == 0 or (self.status == 503 and self.code == "starting")

    def during(self, windows: Sequence[tuple[float, float]]) -> bool:
        """Whether the request overlapped one of ``windows`` (start, end)."""
        return any(self.sent_at <= end and self.answered_at >= start for start, end in windows)


#: An attempt the fault suite holds the server key of: (rollout id, attempt id, the nonce its
#: token is bound to, from the attempt's `token_nonce`), so it can mint that attempt's token.
AttemptRef = tuple[str, str, str]


def ref_of(rollout: Any) -> AttemptRef | None:
    """The latest attempt of a `calcx.api.models.Rollout` as an AttemptRef (None before its claim)."""
    attempt = rollout.attempts[-1]
    return None if not attempt.token_nonce else (rollout.rollout_id, attempt.attempt_id, attempt.token_nonce)


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "content-type": "application/json"}


def _j(value: Any) -> bytes:
    return json.dumps(value).encode()


def static_cases(key: str, decoy: AttemptRef, finished: AttemptRef) -> list[Case]:
    """Hostile requests that need no live rollout: every endpoint, wrong/missing keys, bad bodies.

    ``decoy`` is a RUNNING attempt the caller holds; ``finished`` a terminal one.
    Nothing here may change state: no valid claim, no valid reward on a real attempt.
    """
    drid, daid, dnonce = decoy
    frid, faid, fnonce = finished
    server = _auth(key)

    def bad_create(name: str, rollout: dict[str, Any]) -> Case:
        """One rollout the create endpoint must refuse (422 invalid_body), nothing created."""
        return Case(name, "POST", "/v1/rollouts", 422, server, _j({"rollouts": [rollout]}), "invalid_body")

    wrong = _auth("not-the-key")
    none = {"content-type": "application/json"}
    forged = _auth(f"calcx-at.{drid}.{daid}.{dnonce}.{'0' * 64}")
    decoy_token = _auth(attempt_token(key, drid, daid, dnonce))
    finished_token = _auth(attempt_token(key, frid, faid, fnonce))
    # a token the key made for these ids under another claim (a rollout deleted and made again)
    earlier_token = _auth(attempt_token(key, drid, daid, "0" * len(dnonce)))
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
        ("POST", f"/v1/rollouts/{drid}/attempts/{daid}/finish", _j({"state": "FAILED", "reason": FailureReason.CRASH})),
        ("PUT", "/v1/models", _j({"model": "evil", "endpoints": ["http://127.0.0.1:9/v1"]})),
        ("GET", "/v1/models", None),
        ("POST", "/v1/leases", _j({"run": LEASED_RUN, "owner": "hostile", "take_over": True})),
        ("POST", "/v1/leases/renew", _j({"run": LEASED_RUN, "owner": "hostile"})),
        ("POST", "/v1/leases/release", _j({"run": LEASED_RUN, "owner": LEASE_HOLDER})),
    ]
    for method, path, body in server_key_endpoints:
        tag = f"{method} {path.split('?')[0]}"
        cases.append(Case(f"no key: {tag}", method, path, 401, none, body, "unauthorized"))
        cases.append(Case(f"wrong key: {tag}", method, path, 401, wrong, body, "unauthorized"))
        cases.append(
            Case(f"attempt token on server-key endpoint: {tag}", method, path, 403, decoy_token, body, "forbidden")
        )
    for path, body in (
        (ev, _j({"event_type": "log", "data": {}})),
        (gw, chat),
        (f"/v1/rollouts/{drid}/attempts/{daid}/v1/models", None),
    ):
        method = "GET" if body is None else "POST"
        tag = f"{method} {path}"
        cases.append(Case(f"no key: {tag}", method, path, 401, none, body, "unauthorized"))
        cases.append(Case(f"wrong key: {tag}", method, path, 401, wrong, body, "unauthorized"))
        cases.append(Case(f"forged attempt token: {tag}", method, path, 401, forged, body, "unauthorized"))
        cases.append(
            Case(f"attempt token of an earlier claim: {tag}", method, path, 401, earlier_token, body, "unauthorized")
        )
        cases.append(Case(f"other attempt's token: {tag}", method, path, 403, finished_token, body, "forbidden"))
    cases += [
        # malformed, oversized and unknown events on a RUNNING attempt
        Case("event: broken JSON", "POST", ev, 422, decoy_token, b'{"event_type": "reward", "data": {', "invalid_json"),
        Case("event: empty body", "POST", ev, 422, decoy_token, b"", "invalid_json"),
        Case("event: not UTF-8", "POST", ev, 422, decoy_token, b'{"event_type": "\xff\xfe"}', "invalid_json"),
        Case("event: JSON array", "POST", ev, 422, decoy_token, b"[1, 2]", "invalid_body"),
        Case("event: no event_type", "POST", ev, 422, decoy_token, _j({"data": {"value": 1}}), "invalid_body"),
        Case(
            "event: data not an object",
            "POST",
            ev,
            422,
            decoy_token,
            _j({"event_type": "log", "data": [1]}),
            "invalid_body",
        ),
        Case(
            "reward: NaN",
            "POST",
            ev,
            422,
            decoy_token,
            b'{"event_type": "reward", "data": {"value": NaN}}',
            "invalid_json",
        ),
        Case(
            "reward: Infinity",
            "POST",
            ev,
            422,
            decoy_token,
            b'{"event_type": "reward", "data": {"value": Infinity}}',
            "invalid_json",
        ),
        Case(
            "reward: 1e999",
            "POST",
            ev,
            422,
            decoy_token,
            b'{"event_type": "reward", "data": {"value": 1e999}}',
            "invalid_reward",
        ),
        Case(
            "reward: string",
            "POST",
            ev,
            422,
            decoy_token,
            _j({"event_type": "reward", "data": {"value": "1.0"}}),
            "invalid_reward",
        ),
        Case(
            "reward: missing value",
            "POST",
            ev,
            422,
            decoy_token,
            _j({"event_type": "reward", "data": {}}),
            "invalid_reward",
        ),
        Case(
            "event: oversized (Content-Length)",
            "POST",
            ev,
            413,
            decoy_token,
            _j({"event_type": "log", "data": {"x": "y" * (MAX_BODY_BYTES + 10)}}),
            "body_too_large",
        ),
        Case(
            "event: over the event body limit, under the server's",
            "POST",
            ev,
            413,
            decoy_token,
            _j({"event_type": "log", "data": {"x": "y" * (MAX_EVENT_BODY_BYTES + 10)}}),
            "body_too_large",
        ),
        Case(
            "event: JSON nested past the depth limit",
            "POST",
            ev,
            422,
            decoy_token,
            b'{"event_type": "log", "data": {"x": ' + b"[" * 80 + b"]" * 80 + b"}}",
            "invalid_json",
        ),
        Case(
            "event: JSON nested deeper than the parser's stack",
            "POST",
            ev,
            422,
            decoy_token,
            b"[" * 5000 + b"]" * 5000,
            "invalid_json",
        ),
        Case(
            "event: attempt id of non-ASCII digits",
            "POST",
            f"/v1/rollouts/{drid}/attempts/%C2%B2/events",
            404,
            server,
            _j({"event_type": "log", "data": {}}),
            "not_found",
        ),
        Case(
            "event: unknown type is stored as data",
            "POST",
            ev,
            200,
            decoy_token,
            _j({"event_type": "definitely-unknown-\u202e", "data": {"nested": {"a": [1, 2, {"b": None}]}}}),
            alt=(413, "attempt_limit"),
        ),
        # rewards out of range (Calc-X: 0..1): 1e39 once turned an update into NaN
        Case(
            "reward: 1e39",
            "POST",
            ev,
            422,
            decoy_token,
            _j({"event_type": "reward", "data": {"value": 1e39}}),
            "invalid_reward",
        ),
        Case(
            "reward: -1",
            "POST",
            ev,
            422,
            decoy_token,
            _j({"event_type": "reward", "data": {"value": -1}}),
            "invalid_reward",
        ),
        Case(
            "reward: 1.5",
            "POST",
            ev,
            422,
            decoy_token,
            _j({"event_type": "reward", "data": {"value": 1.5}}),
            "invalid_reward",
        ),
        Case(
            "event: unknown rollout",
            "POST",
            "/v1/rollouts/no-such-rollout/attempts/1/events",
            404,
            server,
            _j({"event_type": "log", "data": {}}),
            "not_found",
        ),
        Case(
            "event: unknown attempt",
            "POST",
            f"/v1/rollouts/{drid}/attempts/99/events",
            404,
            server,
            _j({"event_type": "log", "data": {}}),
            "not_found",
        ),
        Case(
            "event: finished attempt (its own token)",
            "POST",
            f"/v1/rollouts/{frid}/attempts/{faid}/events",
            409,
            finished_token,
            _j({"event_type": "reward", "data": {"value": 1.0}}),
            "conflict",
        ),
        # gateway
        Case(
            "gateway: stream=true",
            "POST",
            gw,
            400,
            decoy_token,
            _j({"messages": [{"role": "user", "content": "x"}], "stream": True}),
            "stream_unsupported",
        ),
        Case(
            "gateway: n=3",
            "POST",
            gw,
            400,
            decoy_token,
            _j({"messages": [{"role": "user", "content": "x"}], "n": 3}),
            "invalid_request",
        ),
        Case("gateway: no messages", "POST", gw, 400, decoy_token, _j({"messages": []}), "invalid_request"),
        Case("gateway: broken JSON", "POST", gw, 422, decoy_token, b'{"messages": [', "invalid_json"),
        Case(
            "gateway: JSON nested deeper than the parser's stack",
            "POST",
            gw,
            422,
            decoy_token,
            b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            "invalid_json",
        ),
        Case(
            "gateway: attempt id of non-ASCII digits",
            "POST",
            f"/v1/rollouts/{drid}/attempts/%C2%B2/v1/chat/completions",
            404,
            server,
            chat,
            "not_found",
        ),
        # fields that would make tokens of the agent's choosing come back as the policy's sample
        *[
            Case(
                f"gateway: {name}",
                "POST",
                gw,
                400,
                decoy_token,
                _j({"messages": [{"role": "user", "content": "x"}], name: value}),
                "field_not_allowed",
            )
            for name, value in (
                ("logit_bias", {"1001": 100}),
                ("min_tokens", 4000),
                ("ignore_eos", True),
                ("priority", -100),
                ("guided_regex", "4{100}"),
                ("allowed_token_ids", [1001]),
                ("tool_choice", "required"),
                ("response_format", {"type": "json_object"}),
                ("an unknown field", 1),
            )
        ],
        Case(
            "gateway: finished attempt",
            "POST",
            f"/v1/rollouts/{frid}/attempts/{faid}/v1/chat/completions",
            409,
            finished_token,
            chat,
            "attempt_not_running",
        ),
        Case(
            "gateway: oversized",
            "POST",
            gw,
            413,
            decoy_token,
            b"[" + b"1," * (MAX_BODY_BYTES // 2 + 10) + b"1]",
            "body_too_large",
        ),
        # controller and trainer endpoints with bad bodies or states
        Case(
            "claims: max=0",
            "POST",
            "/v1/claims",
            422,
            server,
            _j({"controller_id": "hostile", "max": 0}),
            "invalid_body",
        ),
        Case("claims: no controller_id", "POST", "/v1/claims", 422, server, _j({"max": 1}), "invalid_body"),
        Case("claims: broken JSON", "POST", "/v1/claims", 422, server, b"{max: 1}", "invalid_json"),
        Case(
            "heartbeat: attempts not a list",
            "POST",
            "/v1/claims/heartbeat",
            422,
            server,
            _j({"controller_id": "hostile", "attempts": "all"}),
            "invalid_body",
        ),
        Case(
            "finish: bad state",
            "POST",
            f"/v1/rollouts/{drid}/attempts/{daid}/finish",
            422,
            server,
            _j({"state": "DONE"}),
            "invalid_body",
        ),
        Case(
            "finish: FAILED without reason",
            "POST",
            f"/v1/rollouts/{drid}/attempts/{daid}/finish",
            422,
            server,
            _j({"state": "FAILED"}),
            "invalid_body",
        ),
        Case(
            "finish: SUCCEEDED with reason",
            "POST",
            f"/v1/rollouts/{drid}/attempts/{daid}/finish",
            422,
            server,
            _j({"state": "SUCCEEDED", "reason": FailureReason.CRASH}),
            "invalid_body",
        ),
        Case(
            "finish: unknown rollout",
            "POST",
            "/v1/rollouts/no-such-rollout/attempts/1/finish",
            404,
            server,
            _j({"state": "FAILED", "reason": FailureReason.CRASH}),
            "not_found",
        ),
        Case(
            "finish: finished attempt",
            "POST",
            f"/v1/rollouts/{frid}/attempts/{faid}/finish",
            409,
            server,
            _j({"state": "SUCCEEDED"}),
            "conflict",
        ),
        Case(
            "finish: reason only the cancel API sets",
            "POST",
            f"/v1/rollouts/{drid}/attempts/{daid}/finish",
            422,
            server,
            _j({"state": "FAILED", "reason": FailureReason.CANCELLED_BY_API}),
            "invalid_body",
        ),
        Case(
            "retry: force not a boolean",
            "POST",
            f"/v1/rollouts/{drid}/retry",
            422,
            server,
            _j({"force": [1]}),
            "invalid_body",
        ),
        # a run another trainer holds the lease of: a second trainer's writes for it are fenced off
        Case(
            "trained: a run another trainer holds",
            "POST",
            "/v1/trained",
            409,
            server,
            _j({"run": LEASED_RUN, "step": 1, "rollout_ids": [frid], "owner": "hostile"}),
            "lease_lost",
        ),
        Case(
            "rewind: a run another trainer holds",
            "POST",
            "/v1/trained/rewind",
            409,
            server,
            _j({"run": LEASED_RUN, "after_step": 0, "owner": "hostile"}),
            "lease_lost",
        ),
        Case(
            "cancel: a run another trainer holds",
            "POST",
            "/v1/cancel",
            409,
            server,
            _j({"run": LEASED_RUN, "owner": "hostile"}),
            "lease_lost",
        ),
        Case(
            "lease: renew another trainer's run",
            "POST",
            "/v1/leases/renew",
            409,
            server,
            _j({"run": LEASED_RUN, "owner": "hostile"}),
            "lease_lost",
        ),
        Case(
            "lease: release another trainer's run",
            "POST",
            "/v1/leases/release",
            409,
            server,
            _j({"run": LEASED_RUN, "owner": "hostile"}),
            "lease_lost",
        ),
        Case(
            "lease: release a run nobody leased",
            "POST",
            "/v1/leases/release",
            404,
            server,
            _j({"run": "hostile-never-leased", "owner": "hostile"}),
            "not_found",
        ),
        Case(
            "lease: empty owner",
            "POST",
            "/v1/leases",
            422,
            server,
            _j({"run": "hostile-run", "owner": ""}),
            "invalid_body",
        ),
        Case("lease: no run", "POST", "/v1/leases", 422, server, _j({"owner": "hostile"}), "invalid_body"),
        Case("retry: unknown rollout", "POST", "/v1/rollouts/no-such-rollout/retry", 404, server, None, "not_found"),
        Case("retry: RUNNING rollout", "POST", f"/v1/rollouts/{drid}/retry", 409, server, None, "conflict"),
        Case(
            "wait: unknown rollout",
            "POST",
            "/v1/rollouts/no-such-rollout/wait",
            404,
            server,
            _j({"timeout_s": 0}),
            "not_found",
        ),
        Case("get: unknown rollout", "GET", "/v1/rollouts/no-such-rollout", 404, server, None, "not_found"),
        Case("list: bad state", "GET", "/v1/rollouts?state=EXPLODED", 422, server, None, "invalid_query"),
        Case("list: limit=-1", "GET", "/v1/rollouts?limit=-1", 422, server, None, "invalid_query"),
        Case("terminal: after=abc", "GET", "/v1/terminal?after=abc", 422, server, None, "invalid_query"),
        Case("terminal: timeout_s=nan", "GET", "/v1/terminal?timeout_s=nan", 422, server, None, "invalid_query"),
        bad_create(
            "create: bad rollout id", {"rollout_id": "../../etc/passwd", "row": {"question": "q", "result": "1"}}
        ),
        *[
            bad_create(f"create: rollout id {rid!r}", {"rollout_id": rid, "row": {"question": "q", "result": "1"}})
            for rid in (".", "..")
        ],
        bad_create("create: row lacks env_map field", {"rollout_id": "hostile-no-result", "row": {"question": "q"}}),
        bad_create(
            "create: env_map sets the calculator command",
            {
                "rollout_id": "hostile-env-map",
                "row": {"question": "q", "result": "1", "cmd": '["sh", "-c", "id"]'},
                "env_map": {"QUESTION": "question", "RESULT": "result", CALCX_CALCULATOR_CMD: "cmd"},
            },
        ),
        bad_create(
            "create: env_map maps no QUESTION or RESULT",
            {"rollout_id": "hostile-empty-env-map", "row": {"question": "q", "result": "1"}, "env_map": {}},
        ),
        Case(
            "create: same id, other body",
            "POST",
            "/v1/rollouts",
            409,
            server,
            _j({"rollouts": [{"rollout_id": frid, "row": {"question": "changed", "result": "0"}}]}),
            "conflict",
        ),
        Case(
            "create: oversized",
            "POST",
            "/v1/rollouts",
            413,
            server,
            _j({"rollouts": [{"rollout_id": "big", "row": {"question": "q" * (MAX_BODY_BYTES + 1), "result": "1"}}]}),
            "body_too_large",
        ),
        Case("models: no endpoints", "PUT", "/v1/models", 422, server, _j({"model": "x"}), "invalid_body"),
        Case("unknown endpoint", "GET", "/v1/nothing-here", 404, server, None, "not_found"),
        Case("wrong method", "DELETE", "/v1/rollouts", 405, server, None, "method_not_allowed"),
        Case("healthz is open", "GET", "/healthz", 200, none, None),
    ]
    # an event flood on the decoy: stored up to the per-attempt cap, then refused (413)
    cases += [
        Case(
            "event flood",
            "POST",
            ev,
            200,
            decoy_token,
            _j({"event_type": "log", "data": {"flood": i}}),
            alt=(413, "attempt_limit"),
        )
        for i in range(FLOOD_EVENTS)
    ]
    return cases


def live_cases(key: str, running: list[AttemptRef], finished: list[AttemptRef]) -> list[Case]:
    """Hostile requests against real rollouts of the run: another rollout's token on a RUNNING
    attempt's gateway and events (403), and events/gateway calls on finished attempts (409)."""
    cases: list[Case] = []
    chat = _j({"messages": [{"role": "user", "content": "steal a turn"}]})
    if len(running) >= 2:
        (arid, aaid, anonce), (brid, baid, _) = random.sample(running, 2)
        stolen = _auth(attempt_token(key, arid, aaid, anonce))
        cases.append(
            Case(
                "cross-rollout gateway call",
                "POST",
                f"/v1/rollouts/{brid}/attempts/{baid}/v1/chat/completions",
                403,
                stolen,
                chat,
                "forbidden",
            )
        )
        cases.append(
            Case(
                "cross-rollout reward",
                "POST",
                f"/v1/rollouts/{brid}/attempts/{baid}/events",
                403,
                stolen,
                _j({"event_type": "reward", "data": {"value": 1.0}}),
                "forbidden",
            )
        )
    if finished:
        frid, faid, fnonce = random.choice(finished)
        own = _auth(attempt_token(key, frid, faid, fnonce))
        cases.append(
            Case(
                "reward for a finished rollout",
                "POST",
                f"/v1/rollouts/{frid}/attempts/{faid}/events",
                409,
                own,
                _j({"event_type": "reward", "data": {"value": 0.5}}),
                "conflict",
            )
        )
        cases.append(
            Case(
                "gateway call for a finished rollout",
                "POST",
                f"/v1/rollouts/{frid}/attempts/{faid}/v1/chat/completions",
                409,
                own,
                chat,
                "attempt_not_running",
            )
        )
    return cases


def send(http: httpx.Client, case: Case) -> Outcome:
    sent_at = time.time()
    try:
        resp = http.request(case.method, case.path, headers=case.headers, content=case.body)
    except httpx.HTTPError:
        return Outcome(case, 0, None, False, sent_at, time.time())
    code = None
    try:
        payload = resp.json()
        if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
            code = payload["error"].get("code")
    except ValueError:
        pass
    ok = (resp.status_code == case.expect and (case.code is None or code == case.code)) or (
        case.alt is not None and (resp.status_code, code) == case.alt
    )
    return Outcome(case, resp.status_code, code, ok, sent_at, time.time())


class HostileClient(threading.Thread):
    """Sends hostile requests in a loop until stopped. `summary` judges them: a request left
    unanswered (no answer, 503 ``starting``) while the server was restarting is not counted; one
    left unanswered at any other time is a wrong answer."""

    def __init__(
        self,
        base_url: Callable[[], str],
        key: str,
        decoy: AttemptRef,
        finished: AttemptRef,
        live: Callable[[], tuple[list[AttemptRef], list[AttemptRef]]] | None = None,
        pause_s: float = 0.02,
    ) -> None:
        super().__init__(name="hostile-client", daemon=True)
        self.base_url = base_url
        self.key = key
        self.static = static_cases(key, decoy, finished)
        self.live = live
        self.pause_s = pause_s
        self.outcomes: list[Outcome] = []
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        self.join(30)

    def run(self) -> None:
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
                    self.outcomes.append(send(http, case))
                    self._halt.wait(self.pause_s)

    def summary(self, restarts: Sequence[tuple[float, float]] = ()) -> dict[str, Any]:
        """The figures; ``restarts``: the (start, end) wall-clock windows the server was down."""
        return summarize(self.outcomes, restarts)


def summarize(outcomes: Sequence[Outcome], restarts: Sequence[tuple[float, float]] = ()) -> dict[str, Any]:
    """Right and wrong answers of ``outcomes``; every wrong answer is listed, once per kind with
    its count. Only a request unanswered during one of ``restarts`` is left out of the count."""
    skipped = [o for o in outcomes if o.unanswered and o.during(restarts)]
    counted = [o for o in outcomes if not (o.unanswered and o.during(restarts))]
    wrong: Counter[str] = Counter(
        f"{o.case.name}: want {o.case.expect} {o.case.code or ''}, got "
        + ("no answer outside a restart" if o.status == 0 else f"{o.status} {o.code}")
        for o in counted
        if not o.ok
    )
    return {
        "requests": len(counted),
        "right": sum(1 for o in counted if o.ok),
        "wrong": [f"{text} (x{n})" for text, n in sorted(wrong.items())],
        "by_status": dict(sorted(Counter(o.case.expect for o in counted).items())),
        "kinds": len({o.case.name for o in counted}),
        "flood_refused": sum(1 for o in counted if o.case.name == "event flood" and o.status == 413),
        "flood_stored": sum(1 for o in counted if o.case.name == "event flood" and o.status == 200),
        "skipped_server_down": len(skipped),
    }
