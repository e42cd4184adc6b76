"""Fault and hostile-input run: what a calcx rehearsal survives, measured.

Starts the whole loop as real processes on loopback (server, stub LLM behind a small fault
proxy, controller with the local runner, real agents and MCP calculators), submits a rehearsal
of N rollouts, and while it runs:

- rows carry failure markers: the stub's ``[stub:error500]``, ``[stub:hang=S]``,
  ``[stub:badjson]``, the proxy's ``[fault:reflect-tool]`` (a tool call in the reflection turn),
  ``[fault:garbage]`` (a 200 whose body is not JSON) and hostile final answers
  (``__import__(...)``, ``9**9**9``, 10 MB); calculator bombs (``9**9**8``, ``'9'*10**8``)
  must get a tool error and the rollout finish; hostile question texts (YAML/JSON/shell
  breakers) must reach the agent byte for byte;
- an injector kills agents and calculators by pid (descendants of the controller, matched to
  rollouts through the controller's log and the calculator's pipes), restarts the server
  (SIGTERM and SIGKILL, same port and database), SIGKILLs and restarts the controller, and runs
  a second controller for a while;
- a hostile client hits every endpoint with wrong or missing keys, malformed, oversized and
  unknown events, out-of-range rewards, an event flood past the per-attempt cap, events for
  unknown and finished rollouts and cross-rollout gateway calls, and
  checks each status code.

At the end it audits the store: every rollout terminal, every FAILED attempt with a reason,
a reward on every SUCCEEDED one, no attempt started twice, rewards the agents reported present,
planned faults ending as planned, and recovery time after each restart. ``--queued N`` also
measures the server with N rollouts queued at once. ``--write`` puts the figures into
benchmarks/FAULTS.md.

    PYTHONPATH=src/python /opt/calcx-dev/bin/python benchmarks/faults.py --n 200 --queued 1000 --write

``python benchmarks/faults.py proxy --upstream URL --canary FILE`` serves the fault proxy alone.
The suite itself is the package calcx.faults (hostile inputs, fault proxy, forensics, audit,
injector, the run and its report), which the tests in tests/faults import too.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src" / "python") not in sys.path:
    sys.path.insert(0, str(ROOT / "src" / "python"))

from calcx.faults import killed_trainer  # noqa: E402
from calcx.faults.proxy import main as proxy_main  # noqa: E402
from calcx.faults.report import off_target, render_markdown  # noqa: E402
from calcx.faults.run import run_faults, run_queued  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "proxy":
        return proxy_main(argv[1:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=200, help="rollouts in the fault run (default 200)")
    p.add_argument("--kinds-each", type=int, default=2, help="rows per planned fault kind (default 2)")
    p.add_argument("--concurrency", type=int, default=12, help="per controller (default 12)")
    p.add_argument("--deadline-s", type=float, default=60.0, help="rollout deadline (default 60)")
    p.add_argument(
        "--lease-s",
        type=float,
        default=6.0,
        help="server lease (default 6, shorter than the server's 30 s so that controller restarts recover fast)",
    )
    p.add_argument("--upstream-timeout-s", type=float, default=4.0, help="gateway upstream timeout (default 4)")
    p.add_argument("--calculator-timeout-s", type=float, default=6.0, help="agents' MCP read timeout (default 6)")
    p.add_argument(
        "--agent-timeout-s",
        type=float,
        default=50.0,
        help="agents' whole-run bound (default 50: above the ~30 s the model client's 6 retries take against a failing model, so a model-500 row ends model_unreachable, not timeout)",
    )
    p.add_argument("--timeout-s", type=float, default=420.0, help="give up the fault run after this long")
    p.add_argument("--queued", type=int, default=0, help="also queue this many rollouts at once (e.g. 1000)")
    p.add_argument("--drain-s", type=float, default=20.0, help="how long a controller drains the queue")
    p.add_argument("--workdir", default=None, help="keep logs and databases here")
    p.add_argument("--write", action="store_true", help="write benchmarks/FAULTS.md")
    p.add_argument("--json", action="store_true", help="print the raw results as JSON")
    args = p.parse_args(argv)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    base = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="calcx-faults-"))
    base.mkdir(parents=True, exist_ok=True)
    (base / "run").mkdir(exist_ok=True)
    t0 = time.time()
    res = run_faults(args, base / "run", log)
    queued = None
    if args.queued:
        (base / "queued").mkdir(exist_ok=True)
        queued = run_queued(args, base / "queued", log)
    (base / "killed-trainer").mkdir(exist_ok=True)
    killed = killed_trainer.run_killed(base / "killed-trainer", log)
    command = "PYTHONPATH=src/python /opt/calcx-dev/bin/python benchmarks/faults.py " + " ".join(argv)
    text = render_markdown(args, res, queued, command.strip(), killed)
    if args.json:
        print(json.dumps({"faults": res, "queued": queued, "killed_trainer": killed}, indent=1, default=str))
    else:
        print(text)
    log(f"total {time.time() - t0:.0f}s; logs in {base}")
    if args.write:
        (ROOT / "benchmarks" / "FAULTS.md").write_text(text)
    missed = off_target(res, args.n)
    if missed:
        log(f"off target: {'; '.join(missed)}")
    return 1 if missed or killed_trainer.problems(killed) else 0


if __name__ == "__main__":
    sys.exit(main())
