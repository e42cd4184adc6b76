"""`calcx server`: serve the rollout store, claims, events, model registry and gateway."""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys

from calcx.api.tokens import (
    HOW_TO_MAKE_A_KEY,
    KEY_SOURCES,
    MIN_KEY_CHARS,
    new_key,
    process_server_key,
)
from calcx.common.serving import bind_socket
from calcx.contract.env import CALCX_KEY
from calcx.contract.ready import server_ready_line
from calcx.procs.procutil import forbid_dumps
from calcx.server.assistant_turns import HERMES
from calcx.server.serve import CalcxUvicornServer, uvicorn_config
from calcx.server.settings import DEFAULTS, ServerSettings

# ServerSettings fields that `calcx server` sets with a flag of the same name (`--lease-s` sets
# lease_s), typed and defaulted by DEFAULTS; the text is the flag's help before its default.
TUNED_SETTINGS: tuple[tuple[str, str], ...] = (
    ("max_tokens_ceiling", "gateway max_tokens ceiling (a larger request is clamped to it)"),
    ("max_body_bytes", "largest request body accepted (a gateway call, a batch of rollouts); past it 413"),
    ("max_event_body_bytes", "largest event body accepted; past it 413"),
    ("max_in_flight_per_attempt", "requests in flight at once with one attempt's URLs (gateway, events); past it 429"),
    ("max_connections", "connections and requests the server holds at once; past it 503 at once"),
    (
        "request_head_timeout_s",
        "a connection that has not sent a whole request head (line and headers) this long "
        "after it opened, or after its next request's first byte, is closed",
    ),
    ("lease_s", "claim lease; controllers heartbeat within it"),
    (
        "run_lease_s",
        "a run's lease; its trainer renews it within it, and a second start of the run is refused " "while it is live",
    ),
    ("max_run_leases", "runs the server holds leases for; past it ended leases make room, live ones are kept"),
    ("max_poll_s", "longest long poll the server holds"),
    ("upstream_timeout_s", "read timeout of one upstream call"),
    ("upstream_retries", "retries of a failed upstream call"),
    ("replica_probe_s", "a model replica that failed gets no new rollout until it answers; it is probed this often"),
    (
        "abort_retry_s",
        "a call the model server aborted (e.g. paused for a weight update) is sent again until "
        "this many seconds have passed, then the agent gets the aborted answer; 0: at once",
    ),
    ("max_events_per_attempt", "events one attempt may post; past it 413"),
    ("max_event_bytes_per_attempt", "bytes of event data one attempt may post"),
    ("max_calls_per_attempt", "model calls one attempt may make; past it 413"),
    ("max_call_bytes_per_attempt", "bytes of recorded requests and answers per attempt"),
    ("retain_s", "delete rollouts terminal for longer than this, with their calls and events; 0 keeps everything"),
    ("reward_min", "smallest reward an agent may post; below it the post is refused"),
    ("reward_max", "largest reward an agent may post; above it the post is refused"),
)


def _shown(name: str, value: int | float) -> str:
    """A default as --help shows it: sizes in MiB where whole, seconds and rewards without noise."""
    if "_bytes" in name:
        return f"{value // 2**20} MiB" if value % 2**20 == 0 else f"{value} bytes"
    return f"{value:g}" if isinstance(value, float) else str(value)


def settings_from_args(args: argparse.Namespace, *, key: str, port: int, public_url: str) -> ServerSettings:
    """The settings `calcx server` serves with: the parsed flags, the key and the bound port."""
    return ServerSettings(
        key=key,
        store_path=args.db,
        host=args.host,
        port=port,
        public_url=public_url,
        log_level=args.log_level,
        access_log=args.access_log,
        tool_call_parser=args.tool_call_parser,
        **{name: getattr(args, name) for name, _ in TUNED_SETTINGS},
    )


def build_parser() -> argparse.ArgumentParser:
    """Every default shown here comes from calcx.server.settings.DEFAULTS."""
    d = DEFAULTS
    p = argparse.ArgumentParser(prog="calcx server", description=__doc__)
    p.add_argument("--host", default=d.host, help=f"address to listen on (default {d.host})")
    p.add_argument("--port", type=int, default=d.port, help=f"port to listen on (default {d.port}; 0 picks a free one)")
    p.add_argument(
        "--db",
        default=d.store_path,
        help=f"SQLite file of the rollout store (default {os.path.join('.', d.store_path)})",
    )
    p.add_argument(
        "--key-file",
        default=None,
        metavar="FILE",
        help=f"file holding the server key, at least {MIN_KEY_CHARS} characters (default: ${CALCX_KEY}); "
        "required, from one or the other",
    )
    p.add_argument("--key", default=None, help=argparse.SUPPRESS)  # refused: see KEY_FLAG_REFUSED
    p.add_argument(
        "--new-key",
        action="store_true",
        help="print a new random server key and exit (for a local run: "
        "`export CALCX_KEY=$(calcx server --new-key)`)",
    )
    p.add_argument(
        "--public-url",
        default=d.public_url,
        help="base URL agents use to reach this server (default http://HOST:PORT)",
    )
    for name, text in TUNED_SETTINGS:
        default = getattr(d, name)
        p.add_argument(
            "--" + name.replace("_", "-"),
            type=type(default),
            default=default,
            help=f"{text} (default {_shown(name, default)})",
        )
    p.add_argument(
        "--tool-call-parser",
        default=d.tool_call_parser,
        metavar="NAME",
        help="the model servers' tool-call parser (vLLM's --tool-call-parser); with "
        f"{HERMES!r}, an earlier turn with tool calls goes back to the model as the model wrote it "
        "(default: not known, turns go as the agent sends them)",
    )
    p.add_argument(
        "--log-level",
        default=d.log_level,
        choices=["debug", "info", "warning", "error"],
        help=f"(default {d.log_level})",
    )
    p.add_argument(
        "--access-log",
        action="store_true",
        default=d.access_log,
        help="log every request and every upstream call (costs throughput; default "
        f"{'on' if d.access_log else 'off'})",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.new_key:
        print(new_key())
        return 0
    try:
        key = process_server_key(
            os.environ,
            args.key,
            args.key_file,
            missing=f"{KEY_SOURCES}; controllers, trainers and the rehearsal use the same key, and agents get "
            f"per-attempt tokens derived from it; {HOW_TO_MAKE_A_KEY}",
        )
    except ValueError as exc:
        print(f"calcx server: {exc}", file=sys.stderr)
        return 2
    forbid_dumps()  # it holds the server key: no agent of the same user may read it out of /proc
    if args.max_tokens_ceiling < 1 or args.max_body_bytes < 1024 or args.lease_s <= 0:
        print(
            "calcx server: --max-tokens-ceiling must be >= 1, --max-body-bytes >= 1024 and --lease-s > 0",
            file=sys.stderr,
        )
        return 2
    if not math.isfinite(args.abort_retry_s) or args.abort_retry_s < 0:
        print(
            f"calcx server: --abort-retry-s must be a number of seconds >= 0, not {args.abort_retry_s}", file=sys.stderr
        )
        return 2
    limits = (
        args.max_events_per_attempt,
        args.max_event_bytes_per_attempt,
        args.max_calls_per_attempt,
        args.max_call_bytes_per_attempt,
        args.max_in_flight_per_attempt,
        args.max_connections,
        args.max_event_body_bytes,
    )
    if min(limits) < 1 or not math.isfinite(args.retain_s) or args.retain_s < 0:
        print(
            "calcx server: the --max-*-per-attempt limits, --max-connections and --max-event-body-bytes must be "
            ">= 1 and --retain-s a number >= 0",
            file=sys.stderr,
        )
        return 2
    if not (math.isfinite(args.reward_min) and math.isfinite(args.reward_max) and args.reward_min <= args.reward_max):
        print(
            f"calcx server: --reward-min and --reward-max must be finite with min <= max, not "
            f"{args.reward_min} and {args.reward_max}",
            file=sys.stderr,
        )
        return 2
    try:  # fail here, with a plain message, rather than inside the server's startup
        from calcx.server.store import RolloutStore

        RolloutStore(args.db).close()
    except Exception as exc:  # sqlite3 errors and OSError alike
        print(f"calcx server: cannot use {args.db!r} as the rollout store: {exc}", file=sys.stderr)
        return 1
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.access_log:
        # httpx logs every upstream call at INFO: that is the access log of the gateway's side
        logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        print(f"calcx server: {exc}", file=sys.stderr)  # names the address
        return 1
    host, port = sock.getsockname()[:2]
    shown_host = f"[{host}]" if ":" in host else host
    public_url = args.public_url or f"http://{shown_host}:{port}"

    from calcx.server.app import create_app

    settings = settings_from_args(args, key=key, port=port, public_url=public_url)
    app = create_app(settings)
    server = CalcxUvicornServer(
        uvicorn_config(
            app,
            log_level=settings.log_level,
            access_log=settings.access_log,
            limit_concurrency=settings.max_connections,
            request_head_timeout_s=settings.request_head_timeout_s,
        )
    )
    # Printed once listening is certain, so a parent process can read the address from stdout.
    print(server_ready_line(f"http://{shown_host}:{port}", public_url, args.db), flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
