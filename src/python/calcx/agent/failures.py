"""The agent's infrastructure failures, one exception class per reason.

The exit status and the last stderr line of each come from :mod:`calcx.contract.failures`
(exit 0 means the agent finished, whatever its answer scored).
"""

from __future__ import annotations

from calcx.contract.failures import EXIT_CODES, failure_line


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
        return failure_line(self.reason, self.detail)


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
