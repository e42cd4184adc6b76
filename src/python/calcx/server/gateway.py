"""OpenAI-compatible gateway: forwards an attempt's chat completions to the policy's inference
servers and records every call token by token.

Sticky per rollout: a rollout's first call goes to the least-loaded replica, and its later
calls to the same one (vLLM's prefix cache); a retry after an upstream failure moves to the next
replica, and the rollout stays where it was answered (calcx.server.replicas). A replica that
failed is probed until it answers. Upstream 5xx, 408, 429, timeouts and connection errors are
retried with bounded exponential backoff; other 4xx answers go back to the agent unchanged.

An answer whose finish reason is `abort` is not the model's: vLLM ends the requests in flight
that way when the trainer pauses generation for a weight update (verl's asynchronous mode). The
gateway sends such a call again, to the endpoints registered by then, until `abort_retry_s` has
passed, and records only the answer the agent gets, with the policy version registered when it
arrived; an agent outside the trainer would otherwise end its session on an empty answer, and its
GRPO group would be left out of the step. Past `abort_retry_s` the aborted answer never reaches
the agent: it would read as an empty answer, score 0 and be trained as a wrong one. The call is
recorded as a 503 `model_aborted` and the caller fails the attempt with that reason
(infrastructure, retried).

A rollout created with `sampling` has those parameters put into every upstream request over the
agent's own; the recorded request is the one forwarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from calcx.contract.failures import FailureReason
from calcx.contract.gateway import CONTEXT_LENGTH_EXCEEDED, context_refused
from calcx.server.assistant_turns import HERMES, for_the_model, read_stated_calls
from calcx.server.chat_fields import CHAT_FIELDS, SAMPLING_FIELDS, Rule, check_fields
from calcx.server.errors import APIError
from calcx.server.metrics import ServerMetrics
from calcx.server.replicas import Replicas
from calcx.server.settings import ServerSettings
from calcx.server.store import CallRecord, RolloutStore
from calcx.server.upstream import LeanHTTPTransport

log = logging.getLogger("calcx.server.gateway")

_RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
#: Retryable answers that mean the replica is alive but busy: they do not take it out of the choice.
_BUSY_STATUS = frozenset({408, 429})
#: The status recorded for an answer whose agent hung up before it came (nginx's "client closed
#: request"): never trained; the agent's resend of the call is the one recorded.
CLIENT_CLOSED = 499


@dataclass
class Forwarded:
    """What the agent gets; `failure` names the attempt's infrastructure failure when there is one."""

    status: int
    content: bytes
    failure: FailureReason | None = None
    detail: str = ""


@dataclass
class UpstreamResult:
    status: int
    content: bytes
    payload: dict[str, Any] | None
    endpoint: str


@dataclass(frozen=True)
class Sent:
    """How sending one call ended: what `forward` records and answers from."""

    body: bytes  # the request as last forwarded (a resend carries the model registered by then)
    result: UpstreamResult | None  # the last answer; None when no try got one
    last_error: str
    endpoint: str  # the endpoint tried last
    latency_s: float  # the answering try's own time (0 when given up on as aborted)
    policy_version: int | None
    aborts: int  # aborted answers received
    gave_up_after_s: float | None = None  # seconds waited when the answer is still aborted past abort_retry_s


def aborted(payload: dict[str, Any] | None) -> bool:
    """Whether an upstream answer is one vLLM cut off (finish reason `abort`) rather than the model's."""
    choices = payload.get("choices") if payload else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return False
    return choices[0].get("finish_reason") == "abort"


def encode_request(request: dict[str, Any]) -> bytes:
    """The JSON bytes of an upstream request, as forwarded and recorded."""
    return json.dumps(request, separators=(",", ":"), ensure_ascii=False).encode()


def _int_list(value: Any) -> list[int]:
    # JSON from vLLM: checking the ends is enough to tell a token list from anything else, and
    # the int32 packing in the store rejects a stray non-integer anyway.
    if isinstance(value, list) and (not value or (type(value[0]) is int and type(value[-1]) is int)):
        return value
    return []


def extract_tokens(payload: dict[str, Any]) -> tuple[list[int], list[int], list[float]]:
    """(prompt token ids, response token ids, response log-probs) from a vLLM-style answer."""
    choices = payload.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    prompt_ids = _int_list(payload.get("prompt_token_ids")) or _int_list(choice.get("prompt_token_ids"))
    response_ids = _int_list(choice.get("token_ids"))
    logprobs: list[float] = []
    lp = choice.get("logprobs")
    if isinstance(lp, dict) and isinstance(lp.get("content"), list):
        for item in lp["content"]:
            if isinstance(item, dict) and isinstance(item.get("logprob"), int | float):
                logprobs.append(float(item["logprob"]))
    return prompt_ids, response_ids, logprobs


class Gateway:
    def __init__(
        self, store: RolloutStore, metrics: ServerMetrics, settings: ServerSettings, replicas: Replicas
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.settings = settings
        self.replicas = replicas
        self._client: httpx.AsyncClient | None = None
        self._probes: dict[str, asyncio.Task[None]] = {}

    async def start(self) -> None:
        s = self.settings
        # One shared client for every upstream call, on the keep-alive transport of upstream.py.
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(s.upstream_timeout_s, connect=s.upstream_connect_timeout_s),
            transport=LeanHTTPTransport(),
        )

    async def close(self) -> None:
        probes, self._probes = list(self._probes.values()), {}
        for task in probes:
            task.cancel()
        for task in probes:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def prepare(self, body: Any, registry: dict[str, Any]) -> dict[str, Any]:
        """The upstream request: checked, only the fields of `calcx.server.chat_fields.CHAT_FIELDS`
        the agent may set (any other is a 400 `field_not_allowed`), model replaced, earlier model
        turns as the model wrote them when the model servers' parser is known
        (calcx.server.assistant_turns), token ids and log-probs asked for, max_tokens clamped to the
        ceiling (or set to it when absent)."""
        if not isinstance(body, dict):
            raise APIError(400, "invalid_request", "a chat completion request must be a JSON object")
        check_fields(body)
        if body.get("stream"):
            raise APIError(
                400,
                "stream_unsupported",
                "stream: true is not supported by the calcx gateway (calls are recorded whole); send stream: false",
            )
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise APIError(400, "invalid_request", "'messages' must be a non-empty list of chat messages")
        n = body.get("n", 1)
        if n not in (None, 1):
            raise APIError(400, "invalid_request", f"n={n!r} is not supported; the gateway records one choice (n=1)")
        out = {name: value for name, value in body.items() if CHAT_FIELDS[name].rule is not Rule.GATEWAY}
        out["messages"] = for_the_model(messages, self.settings.tool_call_parser)
        out["stream"] = False
        out["model"] = registry["model"]
        out["return_token_ids"] = True
        out["logprobs"] = True
        ceiling = self.settings.max_tokens_ceiling
        has_limit = False
        for field in ("max_tokens", "max_completion_tokens"):
            value = body.get(field)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise APIError(400, "invalid_request", f"{field} must be a positive integer, got {value!r}")
            out[field] = min(value, ceiling)
            has_limit = True
        if not has_limit:
            out["max_tokens"] = ceiling
        return out

    def apply_sampling(self, request: dict[str, Any], sampling: dict[str, Any], rollout_id: str) -> dict[str, Any]:
        """The request with the rollout's sampling parameters in place of the agent's: the trainer
        trains on the recorded log-probs, so its distribution is the one sampled. Every sampling
        parameter the agent set is dropped, those the rollout leaves out too (the model server's
        default applies, as for an agent that sets none). A rollout without sampling parameters
        passes through as the agent sent it."""
        if not sampling:
            return request
        overridden = {k: v for k, v in request.items() if k in SAMPLING_FIELDS and sampling.get(k) != v}
        if overridden:
            log.debug(
                "rollout %s: agent's sampling %s replaced by the rollout's %s",
                rollout_id,
                overridden,
                {k: sampling.get(k) for k in overridden},
            )
        return {**{k: v for k, v in request.items() if k not in SAMPLING_FIELDS}, **sampling}

    def pick_endpoints(
        self, rollout_id: str, endpoints: list[str], registry_now: Callable[[], dict[str, Any]]
    ) -> list[str]:
        """Endpoints in the order to try (calcx.server.replicas: the rollout's home first); every
        one of them that is down gets a probe, which reads the registry of its moment."""
        order = self.replicas.order(rollout_id, endpoints)
        for endpoint in self.replicas.down(endpoints):
            self._watch(endpoint, registry_now)
        return order

    def _watch(self, endpoint: str, registry_now: Callable[[], dict[str, Any]]) -> None:
        if endpoint not in self._probes and self._client is not None:
            self._probes[endpoint] = asyncio.get_running_loop().create_task(
                self._probe(endpoint, registry_now), name=f"calcx-probe {endpoint}"
            )

    async def _probe(self, endpoint: str, registry_now: Callable[[], dict[str, Any]]) -> None:
        """Every `replica_probe_s`, `GET {endpoint}/models` until it answers 200 (the replica is
        up again) or the endpoint leaves the registry (it stays down; a later call that finds it
        registered again starts a new probe)."""
        s = self.settings
        try:
            while self._client is not None and endpoint in (registry_now().get("endpoints") or ()):
                await asyncio.sleep(s.replica_probe_s)
                try:
                    resp = await self._client.get(f"{endpoint}/models", timeout=s.upstream_connect_timeout_s)
                except httpx.HTTPError:
                    continue
                if resp.status_code == 200:
                    log.info("model endpoint %s answers again", endpoint)
                    self.replicas.revived(endpoint)
                    return
        finally:
            if self._probes.get(endpoint) is asyncio.current_task():
                del self._probes[endpoint]

    async def _post(self, endpoint: str, body: bytes) -> UpstreamResult:
        assert self._client is not None, "gateway not started"
        self.metrics.replica_calls.labels(endpoint).inc()
        with self.replicas.sending(endpoint):
            resp = await self._client.post(
                f"{endpoint}/chat/completions", content=body, headers={"content-type": "application/json"}
            )
        payload = None
        if resp.status_code == 200:
            try:
                parsed = json.loads(resp.content)
            except ValueError:
                parsed = None
            if not isinstance(parsed, dict):
                # A 200 without a JSON object is a broken upstream: treat it like a 502.
                return UpstreamResult(502, resp.content, None, endpoint)
            payload = parsed
        else:
            try:
                parsed = json.loads(resp.content)
                payload = parsed if isinstance(parsed, dict) else None
            except ValueError:
                payload = None
        return UpstreamResult(resp.status_code, resp.content, payload, endpoint)

    async def _try_endpoints(
        self,
        rollout_id: str,
        order: list[str],
        body: bytes,
    ) -> tuple[UpstreamResult | None, str, str]:
        """One call with bounded retries over `order`: (the answer, or None when every try failed;
        the last error; the endpoint tried last). An endpoint that answers becomes the rollout's
        home; one that fails (not merely busy) is down."""
        s = self.settings
        tries = 1 + max(0, s.upstream_retries)
        last_error = "no try made"
        result: UpstreamResult | None = None
        endpoint = order[0]
        for attempt in range(tries):
            endpoint = order[attempt % len(order)]
            try:
                result = await self._post(endpoint, body)
            except httpx.TimeoutException as exc:
                result = None
                last_error = f"timeout ({type(exc).__name__}) from {endpoint}"
                self.metrics.upstream_errors.labels("timeout").inc()
                self._failed(endpoint, last_error)
            except httpx.TransportError as exc:
                result = None
                last_error = f"cannot reach {endpoint}: {type(exc).__name__}: {exc}"
                self.metrics.upstream_errors.labels("connect").inc()
                self._failed(endpoint, last_error)
            else:
                if result.status not in _RETRYABLE_STATUS:
                    self.replicas.answered(rollout_id, endpoint)
                    break
                if result.status not in _BUSY_STATUS:
                    self._failed(endpoint, f"HTTP {result.status}")
                self.metrics.upstream_errors.labels(str(result.status)).inc()
                last_error = f"HTTP {result.status} from {endpoint}: {result.content[:300].decode(errors='replace')}"
            if attempt + 1 < tries:
                await self._back_off(attempt)
        return result, last_error, endpoint

    def _failed(self, endpoint: str, error: str) -> None:
        if self.replicas.failed(endpoint):
            log.warning("model endpoint %s is down (%s); new rollouts go elsewhere until it answers", endpoint, error)

    async def _back_off(self, attempt: int) -> None:
        s = self.settings
        delay = min(s.upstream_backoff_max_s, s.upstream_backoff_s * (2 ** min(attempt, 30)))
        await asyncio.sleep(delay * (0.5 + random.random() / 2))

    async def forward(
        self,
        rollout_id: str,
        attempt_id: str,
        request: dict[str, Any],
        registry_now: Callable[[], dict[str, Any]],
        agent_gone: Callable[[], Awaitable[bool]] | None = None,
        encoded: bytes | None = None,
    ) -> Forwarded:
        """Send the call (`_send`: endpoints picked per rollout, retries, resends of aborted
        answers), record it once, return what the agent gets. `registry_now` gives the model
        registry as it is at the time; an answer that arrives after the agent hung up
        (`agent_gone`) is recorded as 499, only until the agent's resend is. `encoded`: the
        request's bytes (`encode_request`) when the caller has them already."""
        sent = await self._send(rollout_id, attempt_id, request, registry_now, encoded)
        if sent.gave_up_after_s is not None and sent.result is not None:
            call, answer = self._aborted(rollout_id, attempt_id, sent, sent.result, sent.gave_up_after_s)
        elif sent.result is not None and sent.result.status not in _RETRYABLE_STATUS:
            call, answer = await self._answered(rollout_id, attempt_id, sent, sent.result, agent_gone)
        else:
            call, answer = self._unavailable(rollout_id, attempt_id, sent)
        self._record(call)
        self.metrics.gateway_calls.labels(str(answer.status)).inc()
        if answer.failure is None:
            # A call given up on as aborted has no model latency to count.
            self.metrics.gateway_latency.observe(call.latency_s)
        return answer

    async def _send(
        self,
        rollout_id: str,
        attempt_id: str,
        request: dict[str, Any],
        registry_now: Callable[[], dict[str, Any]],
        encoded: bytes | None = None,
    ) -> Sent:
        """The call sent with retries over the rollout's endpoints, and sent again while its answer
        is aborted, to the registry of that moment, until `abort_retry_s` has passed since the
        first try."""
        s = self.settings
        started = time.perf_counter()
        registry = registry_now()
        body = encode_request(request) if encoded is None else encoded
        aborts = 0
        while True:
            order = self.pick_endpoints(rollout_id, registry["endpoints"], registry_now)
            try_started = time.perf_counter()
            result, last_error, endpoint = await self._try_endpoints(rollout_id, order, body)
            if result is None or result.status != 200 or not aborted(result.payload):
                break
            self.metrics.upstream_errors.labels("abort").inc()
            waited = time.perf_counter() - started
            if waited >= s.abort_retry_s:
                return Sent(
                    body,
                    result,
                    last_error,
                    endpoint,
                    0.0,
                    registry.get("policy_version"),
                    aborts + 1,
                    gave_up_after_s=waited,
                )
            await self._back_off(aborts)
            aborts += 1
            current = registry_now()
            if current.get("endpoints"):
                if current.get("model") and current["model"] != request.get("model"):
                    request = {**request, "model": current["model"]}
                    body = encode_request(request)
                registry = current
        # The answering try's own time: an aborted call's wait through a weight update is not the
        # model's latency.
        latency = time.perf_counter() - try_started
        policy_version = registry.get("policy_version")
        if aborts and result is not None and not aborted(result.payload):
            log.info("rollout %s attempt %s: answered after %d aborted tries", rollout_id, attempt_id, aborts)
            # A resent call waits in the paused model server through the update and is answered
            # by the weights published meanwhile (a generation that spans an update is aborted), so
            # it carries the version registered when its answer arrives.
            current = registry_now()
            if current.get("policy_version") is not None:
                policy_version = current["policy_version"]
        return Sent(body, result, last_error, endpoint, latency, policy_version, aborts)

    def _record(self, call: CallRecord) -> None:
        try:
            self.store.calls.record(call)
        except (TypeError, OverflowError):
            # token ids that are not int32 integers: keep the call, without them
            log.warning("rollout %s: upstream token ids are not integers; recorded without them", call.rollout_id)
            self.store.calls.record(call.without_tokens())

    async def _answered(
        self,
        rollout_id: str,
        attempt_id: str,
        sent: Sent,
        result: UpstreamResult,
        agent_gone: Callable[[], Awaitable[bool]] | None,
    ) -> tuple[CallRecord, Forwarded]:
        """An upstream answer the agent gets as it came (200, or a 4xx other than 408 and 429)."""
        payload = result.payload
        content = result.content
        ids: tuple[list[int], list[int], list[float]] = ([], [], [])
        if result.status == 200 and payload is not None:
            ids = extract_tokens(payload)
            read = read_stated_calls(payload) if self.settings.tool_call_parser == HERMES else None
            if read is not None:  # calls vLLM's parser left in the text: made, and recorded so
                self.metrics.stated_calls_read.inc()
                content = json.dumps(read).encode()
        elif payload is not None and context_refused(result.status, payload.get("error")):
            # the policy outgrew its context: the agent ends its run unanswered (calcx.contract.gateway)
            content = json.dumps({"error": {**payload["error"], "code": CONTEXT_LENGTH_EXCEEDED}}).encode()
        status = result.status
        abandoned = agent_gone is not None and await agent_gone()
        if abandoned:
            log.info(
                "rollout %s attempt %s: the agent hung up before the answer came; recorded as %d",
                rollout_id,
                attempt_id,
                CLIENT_CLOSED,
            )
            status = CLIENT_CLOSED
        call = CallRecord(
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            request=sent.body,
            response=content if payload is not None else None,
            status_code=status,
            latency_s=sent.latency_s,
            policy_version=sent.policy_version,
            endpoint=result.endpoint,
            prompt_token_ids=ids[0],
            response_token_ids=ids[1],
            response_logprobs=ids[2],
            abandoned=abandoned,
        )
        return call, Forwarded(result.status, content)

    def _unavailable(self, rollout_id: str, attempt_id: str, sent: Sent) -> tuple[CallRecord, Forwarded]:
        """Every try failed (a retryable status, a timeout, no connection): a 502 for the agent."""
        tries = 1 + max(0, self.settings.upstream_retries)
        message = f"model endpoint failed after {tries} tries; last error: {sent.last_error}"
        log.warning("rollout %s attempt %s: %s", rollout_id, attempt_id, message)
        error = json.dumps({"error": {"code": "upstream_unavailable", "message": message}}).encode()
        call = CallRecord(
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            request=sent.body,
            response=error,
            status_code=502,
            latency_s=sent.latency_s,
            policy_version=sent.policy_version,
            endpoint=sent.endpoint,
        )
        return call, Forwarded(502, error)

    def _aborted(
        self, rollout_id: str, attempt_id: str, sent: Sent, result: UpstreamResult, waited: float
    ) -> tuple[CallRecord, Forwarded]:
        """An answer the model server aborted through all of `abort_retry_s`: recorded as a 503
        (never trained), and a `model_aborted` failure for the attempt instead of an empty answer."""
        detail = (
            f"the model server aborted this call {sent.aborts} times in {waited:.0f} s (abort_retry_s="
            f"{self.settings.abort_retry_s:g}); a weight update outlasted the resend window"
        )
        log.warning(
            "rollout %s attempt %s: %s; failing the attempt (%s)",
            rollout_id,
            attempt_id,
            detail,
            FailureReason.MODEL_ABORTED,
        )
        error = json.dumps({"error": {"code": FailureReason.MODEL_ABORTED, "message": detail}}).encode()
        call = CallRecord(
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            request=sent.body,
            response=error,
            status_code=503,
            latency_s=sent.latency_s,
            policy_version=sent.policy_version,
            endpoint=result.endpoint,
        )
        return call, Forwarded(503, error, failure=FailureReason.MODEL_ABORTED, detail=detail)
