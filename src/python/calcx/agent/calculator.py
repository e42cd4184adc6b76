"""The MCP calculator the agent talks to over stdio.

``python -m calcx.agent.calculator`` serves the ``calculate`` tool of the
``mcp_server_calculator`` package on stdin/stdout, within the bounds of
calcx.agent.calculator_limits (expression length, result size, time per call, rlimits). The agent starts it with its
own interpreter (so no other installation is needed); ``CALCX_CALCULATOR_CMD``
(a JSON list) replaces the command, e.g. for a runner that hands out
pre-started calculators.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping

from calcx.contract.env import AGL_PREFIX, CALCX_CALCULATOR_CMD, DEFAULT_ENV_MAP, agent_base_env


def calculator_command(env: Mapping[str, str] | None = None) -> list[str]:
    """The command line that starts the calculator (ValueError if the override is malformed)."""
    env = os.environ if env is None else env
    raw = (env.get(CALCX_CALCULATOR_CMD) or "").strip()
    if raw:
        return parse_calculator_command(raw, CALCX_CALCULATOR_CMD)
    return [sys.executable, "-m", "calcx.agent.calculator"]


def parse_calculator_command(raw: str, name: str) -> list[str]:
    """A JSON list of strings (a command line), or ValueError naming ``name``."""
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"environment variable {name} must be a JSON list of strings: {exc}") from None
    if not isinstance(value, list) or not value or not all(isinstance(x, str) and x for x in value):
        raise ValueError(f"environment variable {name} must be a non-empty JSON list of strings, got {raw[:200]!r}")
    return value


def calculator_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for the calculator process: ours without the agent's secrets, plus our
    import path so that ``-m calcx.agent.calculator`` resolves wherever the agent runs."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith(AGL_PREFIX)}
    for name in DEFAULT_ENV_MAP:  # the row's data (the question, its answer) is the agent's alone
        env.pop(name, None)
    paths = [p for p in sys.path if p and os.path.exists(p)]
    existing = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join(paths + ([existing] if existing else []))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def isolated_calculator_environment() -> dict[str, str]:
    """Environment for a calculator a process other than the agent starts (the in-process
    calculator's child: the anchor, the data commands): only what a local agent may inherit
    (calcx.contract.env's allowlist: no server key, tracker or hub credentials), plus our import path."""
    return calculator_environment(agent_base_env(os.environ))


def main() -> int:
    """Serve the calculator tool over stdio until stdin closes."""
    from mcp_server_calculator.calculator import mcp

    from calcx.agent.calculator_limits import install, limit_process

    install()  # bounded expressions and results: a bomb gets a tool error, not the machine
    limit_process()  # and rlimits for whatever the bounds miss
    # FastMCP logs every request at INFO to stderr, which the agent shares; keep it quiet.
    logging.getLogger().setLevel(logging.WARNING)
    mcp.run(transport="stdio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
