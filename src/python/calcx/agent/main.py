"""The agent's entry point: one question in, one reward posted, an exit status out.

``run_agent(env)`` is what ``python -m calcx.agent`` and the local runner's
pre-forked workers call. It never raises: every outcome is an exit status
(see :mod:`calcx.contract.failures`) and, on failure, a last stderr line
``calcx-agent: failure: <reason> <detail>``. No reward is posted unless the
agent finished.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass

from calcx.agent.answer import extract_answer
from calcx.agent.config import AgentConfig
from calcx.agent.failures import AgentCrash, AgentFailure, AgentTimeout
from calcx.agent.reward import reward
from calcx.contract.env import CALCX_AGENT_TIMEOUT_S
from calcx.contract.failures import EXIT_OK


@dataclass(frozen=True)
class Outcome:
    answer: str
    reward: float
    message: str


async def _rollout(config: AgentConfig, deadline: float) -> Outcome:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise AgentTimeout(f"run exceeded {config.run_timeout_s:g} s before the agent started")
    posted: list[Outcome] = []
    try:
        async with asyncio.timeout(remaining) as scope:
            from calcx.agent.reward_post import post_reward
            from calcx.agent.rollout import solve

            async def report(message: str) -> Outcome:
                # before the calculator's teardown (solve): the reward does not wait for it
                answer = extract_answer(message)
                value = reward(answer, config.result, config.rel_tol)
                await post_reward(config.event_url, config.key, value)
                posted.append(Outcome(answer=answer, reward=value, message=message))
                return posted[0]

            return await solve(config, report)
    except TimeoutError:
        if scope.expired():
            if posted:  # the deadline passed during the teardown: the run had finished (status 0 iff posted)
                return posted[0]
            raise AgentTimeout(
                f"run exceeded {config.run_timeout_s:g} s ({CALCX_AGENT_TIMEOUT_S} / 300 s bound)"
            ) from None
        raise


def _report_failure(failure: AgentFailure) -> int:
    sys.stdout.flush()
    print(failure.stderr_line(), file=sys.stderr, flush=True)
    return failure.exit_code


def run_agent(env: Mapping[str, str]) -> int:
    """Run one rollout from ``env`` (QUESTION, RESULT, AGL_*); return the exit status."""
    started = time.monotonic()
    try:
        config = AgentConfig.from_env(env)
    except AgentFailure as failure:
        return _report_failure(failure)
    deadline = started + config.run_timeout_s
    try:
        outcome = asyncio.run(_rollout(config, deadline))
    except AgentFailure as failure:
        return _report_failure(failure)
    except Exception as exc:  # noqa: BLE001 - an unexpected error is a crash, reported as one
        traceback.print_exc(file=sys.stderr)
        return _report_failure(AgentCrash(f"{type(exc).__name__}: {exc}"))
    seconds = time.monotonic() - started
    summary = {
        "answer": outcome.answer[:200],
        "result": config.result[:200],
        "reward": outcome.reward,
        "seconds": round(seconds, 3),
    }
    print(json.dumps(summary), flush=True)
    print(
        f"calcx-agent: finished reward={outcome.reward:g} answer={outcome.answer[:80]!r} seconds={seconds:.2f}",
        file=sys.stderr,
        flush=True,
    )
    return EXIT_OK
