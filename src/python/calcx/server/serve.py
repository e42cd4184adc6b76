"""Running the app under uvicorn: in the foreground (`calcx server`) or in a background thread
(tests, the rehearsal, a trainer in local mode) on a socket bound before the app is built, so
the public URL is known and no other process can take the port in between.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI


class CalcxUvicornServer(uvicorn.Server):
    """Tells the app when shutdown begins, so long polls answer at once instead of holding it."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        state = getattr(getattr(self.config.app, "state", None), "calcx", None)
        if state is not None:
            state.begin_shutdown()
        await super().shutdown(sockets=sockets)


def uvicorn_config(app: FastAPI, *, log_level: str = "warning", access_log: bool = False, **kwargs: Any) -> uvicorn.Config:
    """Settings for throughput: no access log, long keep-alive for controllers and agents."""
    return uvicorn.Config(
        app,
        log_level=log_level,
        access_log=access_log,
        timeout_keep_alive=30,
        timeout_graceful_shutdown=5,
        backlog=2048,
        lifespan="on",
        **kwargs,
    )


def bind_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening TCP socket; port 0 picks a free one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on sockets that say they are TCP,
    # and without it keep-alive answers stall ~40 ms on Nagle + delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(False)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


class ServerThread:
    """A uvicorn server on its own thread and event loop; `stop()` shuts it down cleanly."""

    def __init__(self, app: FastAPI, sock: socket.socket, **config: Any) -> None:
        self.app = app
        self.sock = sock
        self.url = url_of(sock)
        self.server = CalcxUvicornServer(uvicorn_config(app, **config))
        self._thread = threading.Thread(target=self._run, name=f"calcx-server-{self.url}", daemon=True)
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self.sock])  # uvloop when installed, like `calcx server`
        except BaseException as exc:  # reported by start()/stop()
            self._error = exc

    def start(self, timeout: float = 20.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if self._error is not None or not self._thread.is_alive():
                raise RuntimeError(f"calcx server at {self.url} failed to start: {self._error!r}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"calcx server at {self.url} did not start within {timeout} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 20.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.server.force_exit = True
            self._thread.join(5)
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_server_thread(
    store_path: str, key: str, host: str = "127.0.0.1", port: int = 0, public_url: str | None = None, **app_kwargs: Any
) -> ServerThread:
    """Bind, build the app with its real URL, start serving; the caller must `stop()` it."""
    from calcx.server.app import create_app

    sock = bind_socket(host, port)
    try:
        app = create_app(store_path, key, public_url or url_of(sock), **app_kwargs)
        return ServerThread(app, sock).start()
    except BaseException:
        sock.close()
        raise
