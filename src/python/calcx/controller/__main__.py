"""`calcx controller`: claim queued rollouts from the server and run them (local or k8s runner)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from typing import Any

from calcx.api.tokens import KEY_SOURCES, process_server_key
from calcx.contract.ready import controller_ready_line
from calcx.controller.base import Runner
from calcx.controller.concurrency import SLOTS_PER_CORE, default_concurrency
from calcx.controller.sandbox import NAMESPACE, NONE, SANDBOX_MODES, SandboxUnavailable
from calcx.procs.procutil import forbid_dumps

DEFAULT_SERVER = "http://127.0.0.1:8000"


RUNNERS = ("local", "k8s")


def build_parser(runner: str = "local") -> argparse.ArgumentParser:
    """The full parser for `runner`: the common flags plus that runner's own (what --help lists)."""
    p = argparse.ArgumentParser(
        prog="calcx controller",
        description=__doc__,
        epilog="Runner flags are listed for the chosen runner: see also `calcx controller --runner "
        f"{'k8s' if runner != 'k8s' else 'local'} --help`.",
    )
    p.add_argument("--runner", choices=RUNNERS, default="local", help="where rollouts run (default local)")
    p.add_argument(
        "--server",
        default=os.environ.get("CALCX_SERVER", DEFAULT_SERVER),
        help=f"calcx server base URL (default $CALCX_SERVER or {DEFAULT_SERVER})",
    )
    p.add_argument(
        "--key-file",
        default=None,
        metavar="FILE",
        help="file holding the server key (default: $CALCX_KEY); required, from one or the other",
    )
    p.add_argument("--key", default=None, help=argparse.SUPPRESS)  # refused: see KEY_FLAG_REFUSED
    p.add_argument(
        "--concurrency",
        type=int,
        default=default_concurrency(),
        help=f"rollouts run at once (default {SLOTS_PER_CORE} per CPU core, here {default_concurrency()}: "
        "the sweep in benchmarks/RESULTS.md; size it to the inference servers for a real policy)",
    )
    p.add_argument("--controller-id", default=None, help="name in claims and leases (default HOST-PID)")
    p.add_argument(
        "--claim-timeout-s", type=float, default=10.0, help="long-poll length of one claim request (default 10)"
    )
    p.add_argument("--max-rollouts", type=int, default=None, help="exit after running this many (default: forever)")
    p.add_argument(
        "--shutdown-grace-s",
        type=float,
        default=0.0,
        help="on SIGTERM/SIGINT, let running rollouts finish for this long before cancelling them " "(default 0)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="(default info)")
    if runner == "k8s":
        module = _k8s_module()
        if hasattr(module, "add_arguments"):
            module.add_arguments(p)
    else:
        _add_local_arguments(p)
    return p


def _add_local_arguments(p: argparse.ArgumentParser) -> None:
    local = p.add_argument_group("local runner")
    local.add_argument(
        "--agent-cmd",
        default=None,
        help="agent command, a JSON list or a shell-like string (default: this Python -m calcx.agent)",
    )
    local.add_argument(
        "--no-prefork",
        action="store_true",
        help="spawn the agent command once per rollout instead of forking a pre-imported worker",
    )
    local.add_argument(
        "--worker-cmd", default=None, help="pre-forked worker command (default: this Python -m calcx.worker)"
    )
    local.add_argument("--log-dir", default=None, help="write each rollout's agent output to DIR/<rid>.<aid>.log")
    local.add_argument(
        "--sandbox",
        choices=SANDBOX_MODES,
        default=NONE,
        help="namespace: each agent in user, mount, PID, IPC and UTS namespaces of its own (a fresh "
        "/proc, the file system read-only, /tmp, $HOME and the working directory empty and "
        "private); spawns each agent, as --no-prefork does; refuses to start where the "
        "machine has no such namespaces (default none)",
    )


def chosen_runner(argv: list[str] | None) -> str:
    """The --runner value, read before the full parser exists (so that --help, handled by the full
    parser, can list that runner's flags); anything unknown is left for the full parser to reject."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--runner", default="local")
    known, _ = pre.parse_known_args(argv)
    return known.runner if known.runner in RUNNERS else "local"


def _k8s_module() -> Any:
    try:
        from calcx.controller import k8s_cli
    except ImportError as exc:
        raise SystemExit(f"calcx controller: the k8s runner is not available in this build ({exc})") from exc
    return k8s_cli


def build_runner(args: argparse.Namespace) -> Runner:
    if args.runner == "k8s":
        return _k8s_module().build_runner(args)
    from calcx.controller.local_runner import LocalRunner, parse_command_option

    try:
        agent_cmd = parse_command_option(args.agent_cmd) if args.agent_cmd else None
        worker_cmd = parse_command_option(args.worker_cmd) if args.worker_cmd else None
    except ValueError as exc:
        raise SystemExit(f"calcx controller: {exc}") from exc
    sealed = args.sandbox == NAMESPACE
    if sealed:
        logging.getLogger("calcx.controller").info(
            "sandbox namespace: each agent is spawned in namespaces of its own (no pre-forked worker%s)",
            "; --worker-cmd is not used" if worker_cmd else "",
        )
    return LocalRunner(
        agent_cmd=agent_cmd,
        prefork=not (args.no_prefork or sealed),
        zygote_cmd=worker_cmd,
        log_dir=args.log_dir,
        sandbox=args.sandbox,
    )


async def _serve(args: argparse.Namespace, key: str) -> int:
    from calcx.controller.controller import Controller, default_controller_id

    args.controller_id = args.controller_id or default_controller_id()
    runner = build_runner(args)
    controller = Controller(
        args.server,
        key,
        runner,
        concurrency=args.concurrency,
        controller_id=args.controller_id,
        claim_timeout_s=args.claim_timeout_s,
        max_rollouts=args.max_rollouts,
        shutdown_grace_s=args.shutdown_grace_s,
        on_ready=lambda: print(controller_ready_line(runner.name), flush=True),
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, controller.stop)
    logging.getLogger("calcx.controller").info(
        "controller %s: runner %s, concurrency %d, server %s",
        controller.controller_id,
        runner.name,
        args.concurrency,
        args.server,
    )
    await controller.run()
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse with the chosen runner's flags; a flag of the other runner gets an error that says so."""
    runner = chosen_runner(argv)
    parser = build_parser(runner)
    args, extra = parser.parse_known_args(argv)
    if extra:
        other = "k8s" if runner == "local" else "local"
        try:
            other_flags = set(build_parser(other)._option_string_actions) - set(parser._option_string_actions)
        except SystemExit:  # that runner is not in this build
            other_flags = set()
        misplaced = [a.split("=", 1)[0] for a in extra if a.split("=", 1)[0] in other_flags]
        if misplaced:
            parser.error(
                f"{', '.join(misplaced)}: a flag of the {other} runner, not of --runner {runner} "
                f"(see `calcx controller --runner {other} --help`)"
            )
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        key = process_server_key(
            os.environ, args.key, args.key_file, missing=f"{KEY_SOURCES} (the key the server was started with)."
        )
    except ValueError as exc:
        print(f"calcx controller: {exc}", file=sys.stderr)
        return 2
    forbid_dumps()  # it holds the server key beside the agents it starts: none may read it out of /proc
    if args.concurrency < 1:
        print("calcx controller: --concurrency must be at least 1", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        return asyncio.run(_serve(args, key))
    except SandboxUnavailable as exc:  # found by the runner's plan or start, before any claim
        print(f"calcx controller: --sandbox namespace: {exc}; not starting (no agent runs unsealed)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
