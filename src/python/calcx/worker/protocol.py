"""Pre-forked agent worker ("zygote"): pay for imports once, fork one process per rollout.

Starting ``python -m calcx.agent`` costs about 1.4 s of imports (AutoGen, openai, mcp) and the
MCP calculator another ~0.5 CPU-s, per rollout. A zygote is the agent artifact started once in
worker mode (``python -m calcx.worker --socket PATH``, which runs
:func:`calcx.worker.__main__.main`): it imports ``calcx.agent.main`` and the calculator module,
then serves requests on a UNIX socket:

- ``{"op": "agent", "env": {...}}`` with one fd (SCM_RIGHTS) for the child's stdout+stderr:
  fork a child in its own process group that calls ``run_agent(env)`` and exits with its code.
  Replies ``{"pid": N}`` then, when the child is reaped, ``{"exit": {...}}`` (code or signal,
  wall and CPU seconds). ``{"op": "kill"}`` on the same connection kills the child's process
  group; a connection that closes early kills it too.
- ``{"op": "calc"}`` with three fds (the caller's stdin, stdout, stderr): fork a calculator
  process bound to those fds (sent by the tiny launcher in :mod:`calcx.worker.launcher`);
  the calculator dies as soon as the launcher's connection closes.
- ``{"op": "ping"}`` / ``{"op": "stats"}``: readiness and cumulative child CPU.

The zygote is single-threaded and never runs an event loop, so forking it is safe; every child
gets a fresh event loop of its own. Children carry PR_SET_PDEATHSIG, so a zygote that dies
takes its children along, and the zygote exits when its stdin (a pipe from the controller)
closes.
"""

from __future__ import annotations

#: The worker's command is ``python -m WORKER_MODULE --socket PATH`` (the controller's default
#: ``--worker-cmd``; with the agent PEX, ``PEX_MODULE=WORKER_MODULE agent.pex``).
WORKER_MODULE = "calcx.worker"
MAX_FDS = 8  # file descriptors one request may carry
LEARN_ROUNDS = 8  # children that may report lazily imported modules back
MAX_LEARN = 5000  # module names one "learn" request may carry
