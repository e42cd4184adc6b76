"""What a killed trainer left on the server, cancelled before a new run of the same name starts.

A trainer that dies leaves its server and controller (or its database) behind with rollouts
QUEUED or RUNNING. A restarted `calcx train` of the same run would otherwise find them first in
the queue (and their groups are gone with the dead trainer's memory): it cancels them, through the
cancel API, before it creates any work (and once it holds the run's lease: a live run's work is
not an earlier run's leftovers). Their controllers stop the running ones by id; the cancelled
rollouts are not retried (reason cancelled_by_api).
"""

from __future__ import annotations

import asyncio
import logging

from calcx.api.client import AsyncCalcxClient
from calcx.api.models import AttemptRef

log = logging.getLogger("calcx.trainer.rollouts.leftovers")


async def cancel_leftovers(client: AsyncCalcxClient, run: str, owner: str | None = None) -> list[AttemptRef]:
    """Cancel the QUEUED and RUNNING attempts labelled with `run`; returns them. `owner`: this
    start's lease of the run (the server refuses the cancel while another trainer holds it)."""
    cancelled = await client.cancel(
        run=run,
        owner=owner,
        detail=f"a new calcx train of run {run!r} started; this attempt " "was left by an earlier one",
    )
    if cancelled:
        log.warning(
            "calcx train: cancelled %d attempt(s) an earlier run %r left queued or running", len(cancelled), run
        )
    return cancelled


def cancel_previous_run(server_url: str, key: str, run: str, owner: str | None = None) -> int:
    """`cancel_leftovers` from synchronous code; the number of attempts cancelled."""

    async def go() -> int:
        async with AsyncCalcxClient(server_url, key, timeout=30.0) as client:
            return len(await cancel_leftovers(client, run, owner))

    return asyncio.run(go())
