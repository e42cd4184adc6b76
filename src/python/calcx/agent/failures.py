"""The agent's infrastructure failures, one exception class per reason.

The exit status and the last stderr line of each come from :mod:`calcx.contract.failures`
(exit 0 means the agent finished, whatever its answer scored).
"""

from __future__ import annotations

from calcx.contract.failures import EXIT_CODES, FailureReason, failure_line


class AgentFailure(Exception):
    """An infrastructure failure: the rollout did not finish and must not be scored."""

    reason = FailureReason.CRASH

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.reason]

    def stderr_line(self) -> str:
        return failure_line(self.reason, self.detail)


class BadEnvironment(AgentFailure):
    reason = FailureReason.BAD_ENVIRONMENT


class ModelUnreachable(AgentFailure):
    reason = FailureReason.MODEL_UNREACHABLE


class CalculatorFailed(AgentFailure):
    reason = FailureReason.CALCULATOR_FAILED


class AgentTimeout(AgentFailure):
    reason = FailureReason.TIMEOUT


class RewardPostFailed(AgentFailure):
    reason = FailureReason.REWARD_POST_FAILED


class AgentCrash(AgentFailure):
    reason = FailureReason.CRASH
