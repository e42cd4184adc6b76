"""Fixtures of the server tests: a real calcx server and a fake OpenAI-compatible upstream,
each a real uvicorn server on a free loopback port, stopped at the end of the test."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from calcx.api.client import CalcxClient
from calcx.server.serve import ServerThread, bind_socket, start_server_thread

KEY = "test-server-key-0123456789-abcdef"


@dataclass
class FakeUpstream:
    """Behaves like vLLM with return_token_ids: token ids and log-probs on every answer."""

    url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    fail_next: int = 0
    fail_status: int = 500
    fail_error: dict[str, Any] = field(default_factory=lambda: {"message": "injected failure"})
    abort_next: int = 0  # answers cut off as vLLM does when generation is paused: finish reason "abort"
    on_abort: Callable[[], None] | None = None  # called (off the event loop) before each aborted answer
    before_answer: Callable[[], None] | None = None  # called (off the event loop) before each model answer
    delay_s: float = 0.0
    answer_ids: list[int] = field(default_factory=lambda: [7, 8, 9])  # the token ids of every model answer
    answer_text: str = "### ANSWER: 42 ###"  # the text of every model answer
    lock: threading.Lock = field(default_factory=threading.Lock)

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/v1/models")  # the gateway's probe of a replica it saw fail
        async def models() -> JSONResponse:
            return JSONResponse({"object": "list", "data": [{"id": "fake", "object": "model"}]})

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> JSONResponse:
            body = await request.json()
            with self.lock:
                self.requests.append(body)
                failing = self.fail_next > 0
                if failing:
                    self.fail_next -= 1
                aborting = not failing and self.abort_next > 0
                if aborting:
                    self.abort_next -= 1
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if failing:
                return JSONResponse({"error": self.fail_error}, status_code=self.fail_status)
            if aborting:
                if self.on_abort is not None:
                    await asyncio.to_thread(self.on_abort)
                return JSONResponse(
                    {
                        "id": f"chatcmpl-{len(self.requests)}",
                        "object": "chat.completion",
                        "created": 1,
                        "model": body["model"],
                        "prompt_token_ids": [100],
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": ""},
                                "finish_reason": "abort",
                                "token_ids": [],
                                "logprobs": {"content": []},
                            }
                        ],
                    }
                )
            if self.before_answer is not None:
                await asyncio.to_thread(self.before_answer)
            if body.get("model") == "reject-me":
                return JSONResponse({"error": {"message": "bad request upstream"}}, status_code=400)
            words = sum(len(str(m.get("content", "")).split()) for m in body["messages"])
            prompt_ids = list(range(100, 100 + words))
            answer_ids = self.answer_ids
            return JSONResponse(
                {
                    "id": f"chatcmpl-{len(self.requests)}",
                    "object": "chat.completion",
                    "created": 1,
                    "model": body["model"],
                    "prompt_token_ids": prompt_ids,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": self.answer_text},
                            "finish_reason": "stop",
                            "token_ids": answer_ids,
                            "logprobs": {
                                "content": [
                                    {"token": str(t), "logprob": -0.1 * t, "bytes": None, "top_logprobs": []}
                                    for t in answer_ids
                                ]
                            },
                        }
                    ],
                    "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": 3, "total_tokens": words + 3},
                }
            )

        return app


@pytest.fixture
def make_upstream() -> Iterator[Callable[[], FakeUpstream]]:
    """Starts fake upstreams on demand; all are stopped at the end of the test."""
    threads: list[ServerThread] = []

    def start() -> FakeUpstream:
        fake = FakeUpstream()
        thread = ServerThread(fake.app(), bind_socket())
        fake.url = f"{thread.url}/v1"
        threads.append(thread.start())
        return fake

    try:
        yield start
    finally:
        for thread in threads:
            thread.stop()


@pytest.fixture
def upstream(make_upstream: Callable[[], FakeUpstream]) -> FakeUpstream:
    return make_upstream()


@pytest.fixture
def db_path(tmp_path: Path) -> str:
    return str(tmp_path / "calcx.db")


@pytest.fixture
def server(db_path: str) -> Iterator[ServerThread]:
    thread = start_server_thread(db_path, KEY, lease_s=30.0, upstream_backoff_s=0.01, upstream_timeout_s=5.0)
    try:
        yield thread
    finally:
        thread.stop()


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """One server for a whole module, for tests that only read or are refused before acting."""
    path = str(tmp_path_factory.mktemp("shared") / "calcx.db")
    thread = start_server_thread(path, KEY, lease_s=30.0)
    try:
        yield thread
    finally:
        thread.stop()


@pytest.fixture
def server_key() -> str:
    return KEY


@pytest.fixture
def client(server: ServerThread) -> Iterator[CalcxClient]:
    with CalcxClient(server.url, KEY, timeout=10.0) as c:
        yield c


def _read_answer(sock: socket.socket) -> bytes:
    """One HTTP answer (its head, and as much body as its Content-Length says) read from `sock`."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        more = sock.recv(65536)
        if not more:
            return answer
        answer += more
    head, _, body = answer.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0
    )
    while len(body) < length:
        more = sock.recv(65536)
        if not more:
            break
        body += more
    return head + b"\r\n\r\n" + body


@pytest.fixture
def raw_post() -> Callable[..., bytes]:
    """`raw_post(server, path, token, head, body=b"")`: the server's answer to a POST of `head`
    (header lines, each ending in CRLF) and `body`, without sending whatever else the head
    promises: a server that waited for the rest would never answer, and the socket's timeout
    fails the test."""

    def post(server: ServerThread, path: str, token: str, head: str, body: bytes = b"") -> bytes:
        with socket.create_connection((server.host, server.port), timeout=20) as sock:
            sock.sendall(
                f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                f"Content-Type: application/json\r\n{head}\r\n".encode() + body
            )
            return _read_answer(sock)

    return post
