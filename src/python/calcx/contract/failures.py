"""Exit statuses, failure reasons, and the failure line an agent prints before it exits.

Exit 0 means the agent finished, whatever its answer scored. Every other status is an
infrastructure failure that the controller reports as FAILED with a reason (and the trainer
retries instead of training on). The agent names the reason itself on its last stderr line,
``calcx-agent: failure: <reason> <detail>``; the controller reads that line first, then the
exit status.
"""

from __future__ import annotations

#: The server's own reason for an attempt whose model call the model server kept aborting past
#: the gateway's `abort_retry_s` (a weight update that outlasted it): infrastructure, retried.
MODEL_ABORTED = "model_aborted"
#: The reason of an attempt ended by the cancel API (and by a controller that shuts down).
CANCELLED = "cancelled"

#: Every reason a FAILED attempt may carry (the server refuses any other).
FAILURE_REASONS: frozenset[str] = frozenset(
    {
        "timeout",
        "crash",
        "model_unreachable",
        "calculator_failed",
        "reward_post_failed",
        "bad_environment",
        "image_pull",
        "config_error",
        "controller_lost",
        CANCELLED,
        MODEL_ABORTED,
    }
)

EXIT_OK = 0
EXIT_CRASH = 1
EXIT_BAD_ENVIRONMENT = 2
EXIT_MODEL_UNREACHABLE = 10
EXIT_CALCULATOR_FAILED = 11
EXIT_TIMEOUT = 12
EXIT_REWARD_POST_FAILED = 13

#: The agent's exit status for each failure it reports itself.
EXIT_CODES: dict[str, int] = {
    "crash": EXIT_CRASH,
    "bad_environment": EXIT_BAD_ENVIRONMENT,
    "model_unreachable": EXIT_MODEL_UNREACHABLE,
    "calculator_failed": EXIT_CALCULATOR_FAILED,
    "timeout": EXIT_TIMEOUT,
    "reward_post_failed": EXIT_REWARD_POST_FAILED,
}
REASONS_BY_EXIT_CODE: dict[int, str] = {code: reason for reason, code in EXIT_CODES.items()}

FAILURE_MARKER = "calcx-agent: failure:"
FAILURE_PREFIX = FAILURE_MARKER + " "
_MAX_DETAIL = 500


def failure_line(reason: str, detail: str) -> str:
    """The last stderr line of an agent that failed: the marker, the reason, a one-line detail."""
    text = " ".join(detail.split())
    if len(text) > _MAX_DETAIL:
        text = text[: _MAX_DETAIL - 3] + "..."
    return f"{FAILURE_PREFIX}{reason} {text}"


def parse_failure_line(output: str | None) -> str | None:
    """The reason on the last failure line in ``output`` (None when there is none, or when the
    last one names no known reason)."""
    if not output:
        return None
    for line in reversed(output.splitlines()):
        idx = line.find(FAILURE_MARKER)
        if idx >= 0:
            words = line[idx + len(FAILURE_MARKER) :].split()
            if words:
                word = words[0].rstrip(":,;.")
                if word in FAILURE_REASONS:
                    return word
            return None
    return None


def reason_from_agent_exit(exit_code: int, output_tail: str | None) -> str:
    """Failure reason for a non-zero agent exit.

    Preference order: the agent's own failure line (last one wins), then the exit-code table,
    then ``crash`` (a signal or an unknown code).
    """
    reason = parse_failure_line(output_tail)
    if reason is not None:
        return reason
    if exit_code < 0:
        return "crash"
    return REASONS_BY_EXIT_CODE.get(exit_code, "crash")
