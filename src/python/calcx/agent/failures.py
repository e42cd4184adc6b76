"""Exit statuses of the agent and the failures that lead to them.

Exit 0 means the agent finished, whatever its answer scored. Every other status
is an infrastructure failure that the controller retries instead of training on;
the last stderr line names its reason (``calcx-agent: failure: <reason> ...``).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_CRASH = 1
EXIT_BAD_ENVIRONMENT = 2
EXIT_MODEL_UNREACHABLE = 10
EXIT_CALCULATOR_FAILED = 11
EXIT_TIMEOUT = 12
EXIT_REWARD_POST_FAILED = 13

EXIT_CODES: dict[str, int] = {
    "crash": EXIT_CRASH,
    "bad_environment": EXIT_BAD_ENVIRONMENT,
    "model_unreachable": EXIT_MODEL_UNREACHABLE,
    "calculator_failed": EXIT_CALCULATOR_FAILED,
    "timeout": EXIT_TIMEOUT,
    "reward_post_failed": EXIT_REWARD_POST_FAILED,
}
REASONS_BY_EXIT_CODE: dict[int, str] = {code: reason for reason, code in EXIT_CODES.items()}
FAILURE_PREFIX = "calcx-agent: failure: "


class AgentFailure(Exception):
    """An infrastructure failure: the rollout did not finish and must not be scored."""

    reason = "crash"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.reason]

    def stderr_line(self) -> str:
        detail = " ".join(self.detail.split())
        if len(detail) > 500:
            detail = detail[:497] + "..."
        return f"{FAILURE_PREFIX}{self.reason} {detail}"


class BadEnvironment(AgentFailure):
    reason = "bad_environment"


class ModelUnreachable(AgentFailure):
    reason = "model_unreachable"


class CalculatorFailed(AgentFailure):
    reason = "calculator_failed"


class AgentTimeout(AgentFailure):
    reason = "timeout"


class RewardPostFailed(AgentFailure):
    reason = "reward_post_failed"


class AgentCrash(AgentFailure):
    reason = "crash"
