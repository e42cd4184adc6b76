"""``python -m calcx.agent``: run one rollout from ``os.environ`` and exit with its status."""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    """Run the agent on the process environment; ``argv`` is accepted for the CLI and unused."""
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print(
            "usage: python -m calcx.agent\n"
            "Runs one Calc-X rollout. Reads QUESTION, RESULT, AGL_OPENAI_BASE_URL, AGL_EVENT_URL, AGL_KEY\n"
            "from the environment, and the optional RESULT_REL_TOL (the reward's tolerance, default 1e-2) and\n"
            "CALCX_* settings (see docs/agent.md). Exit 0 = finished; 2/10/11/12/13 = infrastructure failure."
        )
        return 0
    from calcx.agent.main import run_agent

    return run_agent(os.environ)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Exit at once: a library's leftover thread or exit hook must not delay or reorder the exit.
    os._exit(code)
