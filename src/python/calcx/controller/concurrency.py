"""The controller's default concurrency (rollouts run at once), chosen by measurement.

benchmarks/concurrency_sweep.py (benchmarks/RESULTS.md, "Controller concurrency sweep") ran the
same 256 stub-model rollouts at 4 to 32 on 2 shared cores: rollouts/s followed the machine's other
load, not the concurrency (no trend from 4 to 32), while the stack's summed PSS grew by about
25 MB a slot. An earlier, quieter pair of runs gave 8 slots 13.3 rollouts/s against 12.0 at 24,
with 0.41 against 0.94 GiB. So a few slots per core keep the cores busy while agents wait on the
model; more only cost memory. Scaling with the core count assumes the agents' CPU stays the
bound; only 2 cores were measured. With a real policy the model, not the CPU, sets the pace:
size --concurrency to the inference servers (the GPU run uses 128).
"""

from __future__ import annotations

import os

SLOTS_PER_CORE = 4


def default_concurrency(cpu_count: int | None = None) -> int:
    """SLOTS_PER_CORE rollouts per core of this machine (`os.cpu_count()` unless given), at least one core's."""
    cores = cpu_count if cpu_count is not None else os.cpu_count()
    return SLOTS_PER_CORE * max(1, cores or 1)
