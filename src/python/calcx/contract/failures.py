"""Exit statuses, failure reasons, and the failure line an agent prints before it exits.

Exit 0 means the agent finished, whatever its answer scored. Every other status is an
infrastructure failure that the controller reports as FAILED with a reason (and the trainer
retries instead of training on). The agent names the reason itself on its last stderr line,
``calcx-agent: failure: <reason> <detail>``; the controller reads that line first, then the
exit status.
"""

from __future__ import annotations

from enum import StrEnum


class FailureReason(StrEnum):
    """Every reason a FAILED attempt may carry (the server refuses any other).

    A `StrEnum`: a member is its own value wherever it is stored, sent or printed (SQLite, JSON,
    metric labels, the failure line), so the bytes stay those of the plain names.
    """

    #: the agent or its run ended without a failure line (a signal, an unknown exit, an error)
    CRASH = "crash"
    #: the whole run passed its deadline
    TIMEOUT = "timeout"
    #: the model endpoint stayed unreachable (or 5xx) through the agent's retries
    MODEL_UNREACHABLE = "model_unreachable"
    #: the MCP calculator died or hung
    CALCULATOR_FAILED = "calculator_failed"
    #: the agent could not post its reward
    REWARD_POST_FAILED = "reward_post_failed"
    #: the agent's environment cannot be carried or is incomplete
    BAD_ENVIRONMENT = "bad_environment"
    #: Kubernetes could not pull the agent image
    IMAGE_PULL = "image_pull"
    #: the runner could not create what the agent needs (a Job, a Secret, its command)
    CONFIG_ERROR = "config_error"
    #: the controller holding the attempt stopped heartbeating past its lease (set by the server)
    CONTROLLER_LOST = "controller_lost"
    #: ended by a controller or runner that shuts down (or stops an attempt it never ran): the
    #: work was not done and is retried
    CANCELLED = "cancelled"
    #: ended by the cancel API (a trainer's start cancelling an earlier run's work, a tool), set by
    #: the server: the work is withdrawn, and a retry is refused unless it is forced
    CANCELLED_BY_API = "cancelled_by_api"
    #: a model call the model server kept aborting past the gateway's `abort_retry_s` (a weight
    #: update that outlasted it), set by the server: infrastructure, retried
    MODEL_ABORTED = "model_aborted"


#: The reasons as plain strings, for checks of values read from the wire or a database.
FAILURE_REASONS: frozenset[str] = frozenset(reason.value for reason in FailureReason)

EXIT_OK = 0
EXIT_CRASH = 1
EXIT_BAD_ENVIRONMENT = 2
EXIT_MODEL_UNREACHABLE = 10
EXIT_CALCULATOR_FAILED = 11
EXIT_TIMEOUT = 12
EXIT_REWARD_POST_FAILED = 13

#: The agent's exit status for each failure it reports itself.
EXIT_CODES: dict[FailureReason, int] = {
    FailureReason.CRASH: EXIT_CRASH,
    FailureReason.BAD_ENVIRONMENT: EXIT_BAD_ENVIRONMENT,
    FailureReason.MODEL_UNREACHABLE: EXIT_MODEL_UNREACHABLE,
    FailureReason.CALCULATOR_FAILED: EXIT_CALCULATOR_FAILED,
    FailureReason.TIMEOUT: EXIT_TIMEOUT,
    FailureReason.REWARD_POST_FAILED: EXIT_REWARD_POST_FAILED,
}
REASONS_BY_EXIT_CODE: dict[int, FailureReason] = {code: reason for reason, code in EXIT_CODES.items()}

FAILURE_MARKER = "calcx-agent: failure:"
FAILURE_PREFIX = FAILURE_MARKER + " "
_MAX_DETAIL = 500


def failure_line(reason: FailureReason, detail: str) -> str:
    """The last stderr line of an agent that failed: the marker, the reason, a one-line detail."""
    text = " ".join(detail.split())
    if len(text) > _MAX_DETAIL:
        text = text[: _MAX_DETAIL - 3] + "..."
    return f"{FAILURE_PREFIX}{reason} {text}"


def parse_failure_line(output: str | None) -> FailureReason | None:
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
                    return FailureReason(word)
            return None
    return None


def reason_from_agent_exit(exit_code: int, output_tail: str | None) -> FailureReason:
    """Failure reason for a non-zero agent exit.

    Preference order: the agent's own failure line (last one wins), then the exit-code table,
    then ``crash`` (a signal or an unknown code).
    """
    reason = parse_failure_line(output_tail)
    if reason is not None:
        return reason
    if exit_code < 0:
        return FailureReason.CRASH
    return REASONS_BY_EXIT_CODE.get(exit_code, FailureReason.CRASH)
