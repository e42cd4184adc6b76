"""A connection that does not finish its request head in time is closed, so connections that
trickle their heads (no key or token needed) cannot hold the server's connection limit."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from calcx.server.serve import ServerThread, start_server_thread

HEAD_TIMEOUT_S = 0.5
PARTIAL_HEAD = b"POST /v1/claims/heartbeat HTTP/1.1\r\nHost: calcx\r\n"  # the blank line never comes


@pytest.fixture
def srv(tmp_path: Path, server_key: str) -> Iterator[ServerThread]:
    server = start_server_thread(
        str(tmp_path / "head.db"), server_key, max_connections=8, request_head_timeout_s=HEAD_TIMEOUT_S
    )
    yield server
    server.stop()


def _connect(srv: ServerThread) -> socket.socket:
    return socket.create_connection((srv.host, srv.port), timeout=30)


def _request(path: str, key: str, body: bytes = b"") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: calcx\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def _read_response(sock: socket.socket) -> bytes:
    """One whole answer (head and its Content-Length of body), however the server wrote it."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(4096)
        assert chunk, f"connection closed after {data!r}"
        body += chunk
    assert len(body) == length, "more than one answer"
    return head


def test_connections_that_never_finish_their_head_are_closed_and_free_the_limit(
    srv: ServerThread, server_key: str
) -> None:
    held = [_connect(srv) for _ in range(8)]
    try:
        for sock in held[:6]:
            sock.sendall(PARTIAL_HEAD)  # the rest send nothing at all
        for sock in held:
            assert sock.recv(1024) == b""  # closed by the server, unanswered
        heartbeat = httpx.post(
            f"{srv.url}/v1/claims/heartbeat",
            json={"controller_id": "ctl"},
            headers={"Authorization": f"Bearer {server_key}"},
            timeout=30,
        )
        assert heartbeat.status_code == 200, heartbeat.text
    finally:
        for sock in held:
            sock.close()


def test_an_idle_keep_alive_connection_and_a_slow_body_are_not_cut(srv: ServerThread, server_key: str) -> None:
    body = b'{"controller_id": "ctl"}'
    with _connect(srv) as sock:
        sock.sendall(_request("/v1/claims/heartbeat", server_key, body))
        assert _read_response(sock).startswith(b"HTTP/1.1 200")
        sock.settimeout(HEAD_TIMEOUT_S * 3)
        with pytest.raises(TimeoutError):  # idle past the head deadline: still open
            sock.recv(1)
        sock.settimeout(30)
        request = _request("/v1/claims/heartbeat", server_key, body)
        sock.sendall(request[: -len(body)])  # a whole head, then the body later
        sock.settimeout(HEAD_TIMEOUT_S * 3)
        with pytest.raises(TimeoutError):
            sock.recv(1)
        sock.settimeout(30)
        sock.sendall(body)
        assert _read_response(sock).startswith(b"HTTP/1.1 200")
