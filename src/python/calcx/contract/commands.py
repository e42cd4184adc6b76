"""The command lines that start a calcx server and a local-runner controller as child processes.

`calcx rehearse` (calcx.rehearse.stack) and `calcx train` (calcx.trainer.run.services) both start
them; the layers let neither import the server or the controller, so the argv is built here, once.
The flags are those of `calcx server` and `calcx controller --runner local`; tests/contract parses
what is built here with those parsers, so a renamed flag fails there rather than at a start.
"""

from __future__ import annotations

from collections.abc import Sequence

SERVER_MODULE = "calcx.server"
CONTROLLER_MODULE = "calcx.controller"
#: A started server's log level: its parent waits for the ready line; each request's line is noise.
SERVER_LOG_LEVEL = "warning"


def server_command(
    python: str,
    *,
    host: str,
    port: int,
    db: str,
    log_level: str = SERVER_LOG_LEVEL,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """`python -m calcx.server` on `host`:`port` (0: a free one) and the SQLite file `db`;
    `extra_args` last, so a caller's flag wins over one set here."""
    return [
        python,
        "-m",
        SERVER_MODULE,
        "--host",
        host,
        "--port",
        str(port),
        "--db",
        db,
        "--log-level",
        log_level,
        *extra_args,
    ]


def controller_command(
    python: str,
    *,
    server_url: str,
    concurrency: int,
    controller_id: str,
    log_level: str | None = None,
    log_dir: str | None = None,
    agent_commands: Sequence[str] = (),
    prefork: bool = True,
    sandbox: str | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """`python -m calcx.controller --runner local` claiming from `server_url`. None (and
    `prefork=True`) leave the controller's own default: no flag. `agent_commands` are the
    `--agent-cmd`/`--worker-cmd` flags for an agent under another Python; `extra_args` last, so a
    caller's flag wins over one set here."""
    return [
        python,
        "-m",
        CONTROLLER_MODULE,
        "--runner",
        "local",
        "--server",
        server_url,
        "--concurrency",
        str(concurrency),
        "--controller-id",
        controller_id,
        *([] if log_level is None else ["--log-level", log_level]),
        *([] if log_dir is None else ["--log-dir", log_dir]),
        *agent_commands,
        *([] if prefork else ["--no-prefork"]),
        *([] if sandbox is None else ["--sandbox", sandbox]),
        *extra_args,
    ]
