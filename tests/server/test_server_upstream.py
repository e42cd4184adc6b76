"""The gateway's keep-alive transport against a hand-written HTTP/1.1 server: chunked bodies,
`Connection: close`, idle connections the server dropped, timeouts and refused connections."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio

from calcx.server.upstream import LeanHTTPTransport


class RawServer:
    """Answers each request per `mode`; counts connections and requests."""

    def __init__(self) -> None:
        self.mode = "length"
        self.connections = 0
        self.requests: list[bytes] = []
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                self.requests.append(body)
                payload = json.dumps({"echo": json.loads(body or b"null"), "n": len(self.requests)}).encode()
                if self.mode == "hang":
                    await asyncio.sleep(30)
                if self.mode == "chunked":
                    half = len(payload) // 2
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                        + b"%x;ext=1\r\n%s\r\n%x\r\n%s\r\n0\r\nX-Trailer: t\r\n\r\n"
                        % (half, payload[:half], len(payload) - half, payload[half:])
                    )
                elif self.mode == "close":
                    writer.write(b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n\r\n" + payload)
                    await writer.drain()
                    writer.close()
                    return
                else:
                    writer.write(
                        b"HTTP/1.1 100 Continue\r\n\r\n"
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                        % (len(payload), payload)
                    )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def drop_idle_connections(self) -> None:
        for writer in self.writers:
            writer.close()
        self.writers.clear()


@pytest_asyncio.fixture
async def raw() -> AsyncIterator[tuple[RawServer, str]]:
    server = RawServer()
    srv = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield server, f"http://127.0.0.1:{port}"
    finally:
        srv.close()
        server.drop_idle_connections()
        await asyncio.wait_for(srv.wait_closed(), 5)


@pytest.mark.asyncio
async def test_keep_alive_chunked_and_interim_answers(raw: tuple[RawServer, str]) -> None:
    server, url = raw
    async with httpx.AsyncClient(transport=LeanHTTPTransport(), timeout=5) as client:
        for i in range(3):
            resp = await client.post(f"{url}/v1/chat/completions", json={"i": i})
            assert resp.status_code == 200 and resp.json() == {"echo": {"i": i}, "n": i + 1}
        assert server.connections == 1  # one kept-alive connection for all three
        server.mode = "chunked"
        resp = await client.post(f"{url}/x", json={"big": "y" * 5000})
        assert resp.status_code == 200 and resp.json()["echo"] == {"big": "y" * 5000}
        assert "transfer-encoding" not in resp.headers
        server.mode = "close"
        resp = await client.post(f"{url}/x", json={})
        assert resp.status_code == 503 and resp.json()["n"] == 5
        server.mode = "length"
        resp = await client.post(f"{url}/x", json={})
        assert resp.status_code == 200 and server.connections == 2  # closed one was not reused


@pytest.mark.asyncio
async def test_connection_dropped_while_idle_is_replaced(raw: tuple[RawServer, str]) -> None:
    server, url = raw
    transport = LeanHTTPTransport()
    async with httpx.AsyncClient(transport=transport, timeout=5) as client:
        assert (await client.post(f"{url}/x", json={"a": 1})).status_code == 200
        server.drop_idle_connections()
        # the transport may not have seen the FIN yet; either way the request must go through once
        resp = await client.post(f"{url}/x", json={"a": 2})
        assert resp.status_code == 200 and resp.json()["echo"] == {"a": 2}
        assert server.requests.count(b'{"a":2}') == 1
        assert server.connections == 2


@pytest.mark.asyncio
async def test_timeouts_and_refused_connections_raise_httpx_errors(raw: tuple[RawServer, str]) -> None:
    server, url = raw
    server.mode = "hang"
    async with httpx.AsyncClient(transport=LeanHTTPTransport(), timeout=httpx.Timeout(0.3, connect=1)) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post(f"{url}/x", json={})
        probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = probe.sockets[0].getsockname()[1]
        probe.close()
        await probe.wait_closed()
        with pytest.raises(httpx.ConnectError):
            await client.post(f"http://127.0.0.1:{port}/x", json={})
