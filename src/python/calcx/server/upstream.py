"""A lean HTTP/1.1 keep-alive transport for the gateway's shared `httpx.AsyncClient`.

The gateway talks plain HTTP to inference servers on a trusted network, many requests at once.
httpcore's pool re-checks every pooled connection on every request (a readability syscall each),
which costs milliseconds of CPU per call at a few hundred open connections; this transport keeps
idle connections on a per-origin stack (O(1) per request) and parses answers with a few
`StreamReader` calls. httpx still builds requests and responses, so callers see plain httpx
(and its exception types). https URLs go through httpx's regular transport.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx

_MAX_HEAD_BYTES = 64 * 1024


class _Conn:
    __slots__ = ("reader", "writer", "idle_since")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0

    def usable(self, now: float, expiry: float) -> bool:
        return (
            not self.writer.is_closing()
            and not self.reader.at_eof()
            and not self.reader._buffer  # type: ignore[attr-defined]  # stray bytes: out of sync
            and now - self.idle_since < expiry
        )

    def close(self) -> None:
        try:
            self.writer.close()
        except Exception:  # already broken; nothing more to release
            pass


class _Stale(Exception):
    """A reused connection died before any answer byte: the request can go out again."""


def _timeouts(request: httpx.Request) -> tuple[float | None, float | None]:
    ext: dict[str, Any] = request.extensions.get("timeout", {})
    return ext.get("connect"), ext.get("read")


class LeanHTTPTransport(httpx.AsyncBaseTransport):
    def __init__(self, keepalive_expiry_s: float = 4.0, max_idle_per_origin: int = 1024) -> None:
        # 4 s: below uvicorn's (and so vLLM's) default 5 s keep-alive, so we rarely reuse a
        # connection the server is closing.
        self._expiry = keepalive_expiry_s
        self._max_idle = max_idle_per_origin
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._fallback: httpx.AsyncHTTPTransport | None = None
        self._closed = False
        self._clock: Callable[[], float] = time.monotonic

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http":
            if self._fallback is None:
                self._fallback = httpx.AsyncHTTPTransport()
            return await self._fallback.handle_async_request(request)
        if self._closed:
            raise httpx.ConnectError("transport is closed", request=request)
        origin = (url.host, url.port or 80)
        body = await request.aread()
        head = self._head(request, len(body))
        connect_timeout, read_timeout = _timeouts(request)
        while True:
            conn, reused = self._checkout(origin)
            if conn is None:
                conn = await self._connect(request, origin, connect_timeout)
            try:
                status, headers, content, keep = await self._exchange(conn, head + body, read_timeout, reused)
            except _Stale:
                conn.close()
                continue  # a fresh connection next time round (reused is False for it)
            except BaseException:
                conn.close()
                raise
            if keep and not self._closed:
                self._checkin(origin, conn)
            else:
                conn.close()
            return httpx.Response(status, headers=headers, content=content, request=request)

    @staticmethod
    def _head(request: httpx.Request, length: int) -> bytes:
        target = request.url.raw_path
        lines = [b"%s %s HTTP/1.1" % (request.method.encode(), target)]
        seen_length = False
        for name, value in request.headers.raw:
            lower = name.lower()
            if lower == b"content-length":
                seen_length = True
                value = str(length).encode()
            elif lower == b"transfer-encoding":
                continue  # the body is sent whole, with a length
            lines.append(name + b": " + value)
        if not seen_length and (length or request.method in ("POST", "PUT", "PATCH")):
            lines.append(b"Content-Length: %d" % length)
        return b"\r\n".join(lines) + b"\r\n\r\n"

    def _checkout(self, origin: tuple[str, int]) -> tuple[_Conn | None, bool]:
        stack = self._idle.get(origin)
        now = self._clock()
        while stack:
            conn = stack.pop()
            if conn.usable(now, self._expiry):
                return conn, True
            conn.close()
        return None, False

    def _checkin(self, origin: tuple[str, int], conn: _Conn) -> None:
        stack = self._idle.setdefault(origin, [])
        if len(stack) >= self._max_idle:
            conn.close()
            return
        conn.idle_since = self._clock()
        stack.append(conn)

    async def _connect(self, request: httpx.Request, origin: tuple[str, int], timeout: float | None) -> _Conn:
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(origin[0], origin[1], limit=_MAX_HEAD_BYTES)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {origin[0]}:{origin[1]} timed out", request=request) from None
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {origin[0]}:{origin[1]}: {exc}", request=request) from exc
        return _Conn(reader, writer)

    async def _exchange(
        self, conn: _Conn, payload: bytes, timeout: float | None, reused: bool
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes, bool]:
        reader, writer = conn.reader, conn.writer
        got_bytes = False
        try:
            async with asyncio.timeout(timeout):
                writer.write(payload)
                await writer.drain()
                while True:
                    try:
                        raw_head = await reader.readuntil(b"\r\n\r\n")
                    except asyncio.IncompleteReadError as exc:
                        if reused and not exc.partial:
                            raise _Stale() from None
                        raise httpx.RemoteProtocolError("server closed the connection without an answer") from None
                    got_bytes = True
                    status, version, headers = _parse_head(raw_head)
                    if 100 <= status < 200 and status != 101:
                        continue  # interim answer (100 Continue): the real one follows
                    break
                fields = {name.lower(): value for name, value in headers}
                keep = version == b"HTTP/1.1"
                conn_header = fields.get(b"connection", b"").lower()
                if b"close" in conn_header:
                    keep = False
                elif b"keep-alive" in conn_header:
                    keep = True
                if b"chunked" in fields.get(b"transfer-encoding", b"").lower():
                    content = await _read_chunked(reader)
                    headers = [(n, v) for n, v in headers if n.lower() != b"transfer-encoding"]
                elif b"content-length" in fields:
                    try:
                        length = int(fields[b"content-length"])
                    except ValueError:
                        raise httpx.RemoteProtocolError("bad Content-Length from upstream") from None
                    content = await reader.readexactly(length)
                elif status in (204, 304):
                    content = b""
                else:
                    content = await reader.read()
                    keep = False
                return status, headers, content, keep
        except TimeoutError:
            raise httpx.ReadTimeout("upstream did not answer in time") from None
        except (ConnectionError, asyncio.IncompleteReadError, OSError) as exc:
            if reused and not got_bytes:
                raise _Stale() from None
            raise httpx.ReadError(f"upstream connection failed: {type(exc).__name__}: {exc}") from exc
        except asyncio.LimitOverrunError:
            raise httpx.RemoteProtocolError("upstream answer headers are too large") from None

    async def aclose(self) -> None:
        self._closed = True
        for stack in self._idle.values():
            for conn in stack:
                conn.close()
        self._idle.clear()
        if self._fallback is not None:
            await self._fallback.aclose()


def _parse_head(raw: bytes) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    lines = raw[:-4].split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
        raise httpx.RemoteProtocolError(f"malformed status line from upstream: {lines[0][:100]!r}")
    try:
        status = int(parts[1])
    except ValueError:
        raise httpx.RemoteProtocolError(f"malformed status line from upstream: {lines[0][:100]!r}") from None
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise httpx.RemoteProtocolError(f"malformed header line from upstream: {line[:100]!r}")
        headers.append((name.strip(), value.strip()))
    return status, parts[0], headers


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    chunks: list[bytes] = []
    while True:
        size_line = await reader.readuntil(b"\r\n")
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise httpx.RemoteProtocolError("malformed chunk size from upstream") from None
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":
                pass  # trailers, ignored
            return b"".join(chunks)
        chunks.append(await reader.readexactly(size))
        await reader.readexactly(2)
