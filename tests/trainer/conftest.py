"""Point the live trainer tests at an interpreter holding the CPU service packages.

Under Pants the `calcx` PEX (default resolve: server, controller, agent, stub LLM) is built
beside the tests; its venv interpreter runs `python -m calcx.server` and friends. An explicit
$CALCX_SERVICES_PYTHON wins.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

_PEX = Path("src.python.calcx/calcx.pex")

if not os.environ.get("CALCX_SERVICES_PYTHON") and _PEX.exists():
    out = subprocess.run(
        [str(_PEX.resolve()), "-c", "import sys; print(sys.executable)"],
        env={**os.environ, "PEX_INTERPRETER": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    os.environ["CALCX_SERVICES_PYTHON"] = out.stdout.strip().splitlines()[-1]
