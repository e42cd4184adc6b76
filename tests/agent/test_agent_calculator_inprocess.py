"""The in-process calculator's child: calls are evaluated in a process of its own under the agent's
calculator's rlimits and allowlisted environment, and one that stops answering is ended without
stalling the caller's event loop.

Real processes: the child (`python -m calcx.agent.calculator_inprocess`), under this interpreter.
"""

from __future__ import annotations

import asyncio
import os
import signal

from calcx.agent.calculator_inprocess import CalculatorProcess, call
from calcx.agent.calculator_limits import CALCULATOR_CPU_S, CALCULATOR_MEMORY_BYTES


def _limits(pid: int) -> dict[str, list[str]]:
    with open(f"/proc/{pid}/limits") as f:
        return {line[:26].strip(): line[26:].split() for line in f.read().splitlines()[1:]}


def test_calls_are_evaluated_in_a_child_under_the_agents_calculator_rlimits(monkeypatch) -> None:
    monkeypatch.setenv("CALCX_KEY", "k" * 40)  # a secret of the calling process: the child never gets it
    process = CalculatorProcess()
    try:
        assert asyncio.run(call("calculate", {"expression": "2 + 3"}, process)) == ("5", False)
        pid = process.pid
        assert pid is not None and pid != os.getpid()
        limits = _limits(pid)
        assert limits["Max address space"][0] == str(CALCULATOR_MEMORY_BYTES)
        assert limits["Max cpu time"][0] == str(CALCULATOR_CPU_S)
        with open(f"/proc/{pid}/environ", "rb") as f:
            names = {item.split(b"=", 1)[0] for item in f.read().split(b"\0") if item}
        assert b"CALCX_KEY" not in names
    finally:
        process.close()
    assert process.pid is None and not os.path.exists(f"/proc/{pid}/limits")


def test_one_slow_step_is_ended_without_stalling_the_event_loop() -> None:
    """A child that does not answer (stopped here, as one step that runs for ever would leave it):
    the caller's loop runs on while it waits, the call gets the time-limit tool error, that child
    is ended and the next call is answered by a new one."""
    process = CalculatorProcess(kill_after_s=1.0)

    async def scenario() -> tuple[tuple[str, bool], int, tuple[str, bool]]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        tick_task = asyncio.create_task(ticker())
        await call("calculate", {"expression": "1 + 1"}, process)
        slow = process.pid
        assert slow is not None
        os.kill(slow, signal.SIGSTOP)
        ticks = 0
        try:
            answer = await asyncio.wait_for(call("calculate", {"expression": "2 + 3"}, process), 30)
        finally:
            if os.path.exists(f"/proc/{slow}/limits"):  # not ended by the call: end it, so the test fails, not hangs
                os.kill(slow, signal.SIGKILL)
        seen = ticks
        assert not os.path.exists(f"/proc/{slow}/limits")  # killed and reaped
        after = await asyncio.wait_for(call("calculate", {"expression": "2 + 3"}, process), 60)
        assert process.pid not in (None, slow)
        tick_task.cancel()
        return answer, seen, after

    try:
        answer, ticks, after = asyncio.run(scenario())
    finally:
        process.close()
    assert answer == ("Error executing tool calculate: the expression took longer than 1 s to evaluate", True)
    assert ticks >= 5  # the loop ran while the call waited (a blocked loop would have ticked at most once)
    assert after == ("5", False)
