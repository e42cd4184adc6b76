"""What the worker imports before it forks: the agent's entry and the calculator module, and the
modules a rollout would otherwise import lazily (children share them copy-on-write)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from calcx.contract.env import CALCX_CALCULATOR_CMD


def _default_calculator_module() -> str | None:
    """The module that ``python -m`` runs for the calculator, or None when it is not one."""
    try:
        from calcx.agent.calculator import calculator_command
    except Exception:  # the agent package has no calculator command: no calculator zygote
        return None
    saved = os.environ.pop(CALCX_CALCULATOR_CMD, None)
    try:
        cmd = list(calculator_command())
    finally:
        if saved is not None:
            os.environ[CALCX_CALCULATOR_CMD] = saved
    if len(cmd) == 3 and cmd[1] == "-m":
        return cmd[2]
    return None


#: Modules a rollout imports lazily; importing them in the zygote keeps every child from paying.
DEFAULT_PRELOAD = (
    "calcx.agent.main",
    "calcx.agent.rollout",
    "calcx.agent.reward_post",
    "calcx.agent.calculator",
    "mcp_server_calculator.calculator",
    "anyio._backends._asyncio",  # the event-loop backend anyio loads on first use
    "anyio.streams.stapled",
    "anyio.streams.tls",
)


def preload(extra: list[str] | None = None) -> tuple[Callable[[dict[str, str]], int] | None, str | None]:
    """Import what every rollout needs, once: the agent entry and the calculator module."""
    from calcx.agent.main import run_agent

    calc_module = _default_calculator_module()
    for name in [*DEFAULT_PRELOAD, *(extra or []), *([calc_module] if calc_module else [])]:
        try:
            __import__(name)
        except ImportError as exc:
            sys.stderr.write(f"calcx-zygote: not preloading {name}: {exc}\n")
    return run_agent, calc_module
