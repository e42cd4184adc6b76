"""``calcx stub-llm``: serve the scripted OpenAI-compatible model over HTTP."""

from __future__ import annotations

import argparse
import asyncio
import sys

from calcx.contract.ready import stub_llm_ready_line
from calcx.stub_llm.modes import MODES, ModeError, parse_mode


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="calcx stub-llm",
        description="Scripted OpenAI-compatible chat-completions server for rehearsals and tests.",
        epilog="modes: " + "; ".join(f"{name}: {text}" for name, text in MODES.items()),
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8001, help="port (default 8001; 0 picks a free one)")
    parser.add_argument("--mode", default="normal", help="server-wide mode, NAME or NAME=SECONDS (default normal)")
    parser.add_argument(
        "--script",
        action="append",
        default=[],
        metavar="FILE",
        help="question->expression table: a Calc-X .parquet/.jsonl dataset or .jsonl with question+expression "
        "(repeatable)",
    )
    parser.add_argument("--model-name", default="calcx-stub", help="model id reported by /v1/models")
    parser.add_argument("--slow-s", type=float, default=1.0, help="delay of the 'slow' mode (default 1.0)")
    parser.add_argument("--hang-s", type=float, default=3600.0, help="how long 'hang' waits (default 3600)")
    parser.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        mode = parse_mode(args.mode)
    except ModeError as exc:
        print(f"calcx stub-llm: error: {exc}", file=sys.stderr)
        return 2
    if args.slow_s < 0 or args.hang_s < 0:
        print("calcx stub-llm: error: --slow-s and --hang-s must be >= 0", file=sys.stderr)
        return 2
    from calcx.common.serving import bind_socket, plain_server
    from calcx.stub_llm.app import create_app
    from calcx.stub_llm.script import ScriptError, load_script

    try:
        script = load_script(args.script)
    except (ScriptError, ValueError) as exc:
        print(f"calcx stub-llm: error: {exc}", file=sys.stderr)
        return 2
    app = create_app(script=script, mode=mode, model_name=args.model_name, slow_s=args.slow_s, hang_s=args.hang_s)
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        print(f"calcx stub-llm: error: {exc} (pick another --port, or 0 for a free one)", file=sys.stderr)
        return 2
    host, port = sock.getsockname()[:2]
    print(stub_llm_ready_line(f"http://{host}:{port}/v1", args.mode, len(script)), flush=True)
    server = plain_server(app, log_level=args.log_level)
    try:
        asyncio.run(server.serve(sockets=[sock]))
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
