"""Serving an ASGI app with uvicorn on a socket bound first: port 0 works (the kernel picks a
free port) and the real address is known before the first request, so no other process can
take the port in between. `ThreadedServer` runs it on a background thread (tests, the fault
suite) with the event loop its configuration names.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any, Self

import uvicorn


def bind_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening TCP socket on ``host:port`` (SO_REUSEADDR, backlog 2048); port 0 picks a free one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on sockets that say they are TCP,
    # and without it keep-alive answers stall ~40 ms on Nagle + delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(2048)
    sock.set_inheritable(False)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def plain_server(app: Any, *, log_level: str = "warning") -> uvicorn.Server:
    """A uvicorn server with plain settings: no access log, no lifespan, the standard asyncio loop."""
    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=False,
        lifespan="off",
        loop="asyncio",
        timeout_graceful_shutdown=1,
        timeout_keep_alive=30,
    )
    return uvicorn.Server(config)


class ThreadedServer:
    """A uvicorn server on its own thread and event loop; ``stop()`` shuts it down cleanly.

    ``app`` is served with :func:`plain_server` settings unless ``server`` (built for ``app``)
    is given; ``sock`` defaults to a free loopback port.
    """

    def __init__(
        self,
        app: Any,
        sock: socket.socket | None = None,
        *,
        server: uvicorn.Server | None = None,
        name: str | None = None,
    ) -> None:
        self.app = app
        self.sock = sock if sock is not None else bind_socket()
        self.host, self.port = self.sock.getsockname()[:2]
        self.url = url_of(self.sock)
        self.server = server if server is not None else plain_server(app)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name or f"uvicorn-{self.url}", daemon=True)

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        await self.server.serve(sockets=[self.sock])

    def _run(self) -> None:
        try:  # the loop the configuration names (uvloop for `loop="auto"` when installed), as `run()` does
            with asyncio.Runner(loop_factory=self.server.config.get_loop_factory()) as runner:
                runner.run(self._serve())
        except BaseException as exc:  # noqa: BLE001 - reported by start()
            self.error = exc

    def start(self, timeout_s: float = 20.0) -> Self:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if self.error is not None or not self._thread.is_alive():
                raise RuntimeError(f"server at {self.url} failed to start: {self.error!r}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"server at {self.url} did not start within {timeout_s} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 20.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self.server.force_exit = True
            self._thread.join(5)
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
