"""Running the app under uvicorn: in the foreground (`calcx server`) or in a background thread
(tests, the fault suite) on a socket bound before the app is built, so the public URL is known
and no other process can take the port in between (`calcx.common.serving`).
"""

from __future__ import annotations

import socket
from typing import Any

import uvicorn
from fastapi import FastAPI

from calcx.common.serving import ThreadedServer, bind_socket, url_of
from calcx.server.request_head import head_deadline_protocol
from calcx.server.settings import DEFAULTS, ServerSettings


class CalcxUvicornServer(uvicorn.Server):
    """Tells the app when shutdown begins, so long polls answer at once instead of holding it."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        state = getattr(getattr(self.config.app, "state", None), "calcx", None)
        if state is not None:
            state.begin_shutdown()
        await super().shutdown(sockets=sockets)


def uvicorn_config(
    app: FastAPI,
    *,
    log_level: str = "warning",
    access_log: bool = False,
    request_head_timeout_s: float = DEFAULTS.request_head_timeout_s,
    **kwargs: Any,
) -> uvicorn.Config:
    """Settings for throughput: no access log, long keep-alive for controllers and agents; a
    deadline on each request's head (calcx.server.request_head)."""
    return uvicorn.Config(
        app,
        log_level=log_level,
        access_log=access_log,
        http=head_deadline_protocol(request_head_timeout_s),
        timeout_keep_alive=30,
        timeout_graceful_shutdown=5,
        backlog=2048,
        lifespan="on",
        **kwargs,
    )


class ServerThread(ThreadedServer):
    """The calcx server on its own thread and event loop (uvloop when installed, like `calcx server`)."""

    def __init__(self, app: FastAPI, sock: socket.socket, **config: Any) -> None:
        super().__init__(
            app, sock, server=CalcxUvicornServer(uvicorn_config(app, **config)), name=f"calcx-server-{url_of(sock)}"
        )


def start_server_thread(
    store_path: str,
    key: str,
    host: str = DEFAULTS.host,
    port: int = 0,
    public_url: str | None = None,
    **settings: Any,
) -> ServerThread:
    """Bind (port 0: a free one), build the app with its real URL, start serving; the caller
    must `stop()` it. `settings`: other ServerSettings fields (lease_s=..., ...)."""
    from calcx.server.app import create_app

    sock = bind_socket(host, port)
    try:
        server_settings = ServerSettings(
            key=key,
            store_path=store_path,
            host=host,
            port=sock.getsockname()[1],
            public_url=public_url or url_of(sock),
            **settings,
        )
        app = create_app(server_settings)
        return ServerThread(
            app,
            sock,
            limit_concurrency=server_settings.max_connections,
            request_head_timeout_s=server_settings.request_head_timeout_s,
        ).start()
    except BaseException:
        sock.close()
        raise
