"""``python -m calcx.worker``: start the pre-forked agent worker on a UNIX socket."""

from __future__ import annotations

import argparse
import errno
import gc
import signal
import sys
import time
from typing import Any

from calcx.procs.procutil import set_parent_death_signal, set_process_name
from calcx.worker.preload import preload
from calcx.worker.protocol import WORKER_MODULE
from calcx.worker.serve import ZygoteServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=f"python -m {WORKER_MODULE}",
        description="Pre-forked agent worker: imports the agent once and forks one process per rollout.",
    )
    parser.add_argument("--socket", required=True, help="UNIX socket path to serve on")
    parser.add_argument("--no-calculator", action="store_true", help="do not serve calculator processes")
    parser.add_argument("--preload", action="append", default=[], help="another module to import before forking")
    parser.add_argument("--no-warmup", action="store_true", help="skip filling library caches before forking")
    parser.add_argument("--spares", type=int, default=4, help="children forked ahead of demand (default 4)")
    parser.add_argument(
        "--child-nice",
        type=int,
        default=5,
        help="niceness added to rollout processes, so orchestration keeps its CPU (default 5)",
    )
    args = parser.parse_args(argv)
    set_parent_death_signal(signal.SIGKILL)
    set_process_name("calcx-zygote")
    t0 = time.perf_counter()
    agent_entry, calc_module = preload(args.preload)
    if args.no_calculator:
        calc_module = None
    warm: dict[str, Any] = {}
    if not args.no_warmup:
        from calcx.worker.warmup import warm_all

        warm = warm_all()
    gc.collect()
    gc.freeze()  # keep the imported heap out of the collector: children share it copy-on-write
    sys.stderr.write(
        f"calcx-zygote: preloaded in {time.perf_counter() - t0:.2f}s (calculator module: {calc_module}; warm-up {warm})\n"
    )
    sys.stderr.flush()
    try:
        return ZygoteServer(
            args.socket, agent_entry, calc_module, spares=max(0, args.spares), child_nice=max(0, args.child_nice)
        ).serve()
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            sys.stderr.write(f"calcx-zygote: socket {args.socket} is in use\n")
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
