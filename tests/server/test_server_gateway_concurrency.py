"""The gateway's recording under concurrent calls: many rollouts call at once, and every recorded
call holds its own request and its own upstream answer's token ids and log-probs, never a
neighbour's, in the order its rollout sent them."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from calcx.api.client import CalcxClient
from calcx.api.models import Claim
from calcx.server.serve import ServerThread, bind_socket

ROLLOUTS = 32
CALLS_EACH = 3


def derived_ids(marker: str, n: int, base: int) -> list[int]:
    """Token ids only this marker's request gets back."""
    return [base + b for b in hashlib.sha256(f"{base}:{marker}".encode()).digest()[:n]]


def logprobs_of(ids: list[int]) -> list[float]:
    return [-(i % 997) / 1000 for i in ids]


class EchoUpstream:
    """A vLLM-like upstream whose answer is a function of the request (its last message), with
    a delay that differs per request so that calls overlap and finish out of order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most_in_flight = 0

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> JSONResponse:
            body = await request.json()
            marker = str(body["messages"][-1]["content"])
            with self.lock:
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                await asyncio.sleep(hashlib.sha256(marker.encode()).digest()[0] / 255 * 0.05)
            finally:
                with self.lock:
                    self.in_flight -= 1
            answer = derived_ids(marker, 4, 5000)
            return JSONResponse(
                {
                    "id": f"chatcmpl-{marker}",
                    "object": "chat.completion",
                    "created": 1,
                    "model": body["model"],
                    "prompt_token_ids": derived_ids(marker, 6, 1000),
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": f"echo {marker}"},
                            "token_ids": answer,
                            "logprobs": {
                                "content": [
                                    {"token": str(t), "logprob": lp, "bytes": None, "top_logprobs": []}
                                    for t, lp in zip(answer, logprobs_of(answer))
                                ]
                            },
                        }
                    ],
                    "usage": {"prompt_tokens": 6, "completion_tokens": 4, "total_tokens": 10},
                }
            )

        return app


@pytest.fixture
def echo_upstream() -> Iterator[tuple[EchoUpstream, str]]:
    fake = EchoUpstream()
    thread = ServerThread(fake.app(), bind_socket()).start()
    try:
        yield fake, f"{thread.url}/v1"
    finally:
        thread.stop()


def claim_all(client: CalcxClient, n: int) -> list[Claim]:
    client.create_rollouts([{"rollout_id": f"conc-{i:02d}", "row": {"question": "q", "result": "4"}} for i in range(n)])
    claims: list[Claim] = []
    for _ in range(10):
        claims += client.claim("ctl", n - len(claims), timeout_s=2).claims
        if len(claims) == n:
            break
    assert len(claims) == n
    return claims


def test_concurrent_calls_are_recorded_with_their_own_tokens(
    client: CalcxClient, server: Any, server_key: str, echo_upstream: tuple[EchoUpstream, str]
) -> None:
    upstream, url = echo_upstream
    client.put_models("policy", [url])
    claims = claim_all(client, ROLLOUTS)

    def drive(claim: Claim) -> list[str]:
        """One agent: its calls in order, each waiting for the previous answer."""
        rid = claim.rollout.rollout_id
        seen = []
        with CalcxClient(server.url, server_key, timeout=30.0) as own:
            for k in range(CALLS_EACH):
                answer = own.chat_completions(
                    rid, claim.attempt_id, {"model": "policy", "messages": [{"role": "user", "content": f"{rid}/{k}"}]}
                )
                seen.append(answer["choices"][0]["message"]["content"])
        return seen

    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = list(pool.map(drive, claims))  # an exception in any agent fails the test here

    # the calls did overlap (otherwise this proves nothing about concurrency)
    assert upstream.most_in_flight >= 4
    for claim, seen in zip(claims, answers):
        rid = claim.rollout.rollout_id
        assert seen == [f"echo {rid}/{k}" for k in range(CALLS_EACH)]  # each agent got its own answers
        calls = client.calls(rid)
        assert [c.seq for c in calls] == list(range(CALLS_EACH))
        for k, call in enumerate(calls):
            marker = f"{rid}/{k}"
            assert call.request["messages"][-1]["content"] == marker
            assert call.response is not None and call.response["id"] == f"chatcmpl-{marker}"
            assert call.prompt_token_ids == derived_ids(marker, 6, 1000)
            assert call.response_token_ids == derived_ids(marker, 4, 5000)
            assert call.response_logprobs == pytest.approx(logprobs_of(derived_ids(marker, 4, 5000)))
            assert call.attempt_id == claim.attempt_id and call.status_code == 200
