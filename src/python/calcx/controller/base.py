"""The runner interface the controller drives: one claim in, one terminal result out.

Every runner (local processes, Kubernetes Jobs) implements :class:`Runner`. The controller
never looks inside a runner; it only maps the :class:`RunResult` onto
``POST /v1/rollouts/{rid}/attempts/{aid}/finish``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from calcx.contract.failures import FAILURE_REASONS, FailureReason

if TYPE_CHECKING:  # pragma: no cover - typing only
    from calcx.api.models import Claim

SUCCEEDED = "SUCCEEDED"
FAILED = "FAILED"


@dataclass
class RunResult:
    """Terminal outcome of one attempt, as reported to the server's ``/finish``."""

    state: str  # "SUCCEEDED" | "FAILED"
    reason: FailureReason | None  # set when FAILED
    exit_code: int | None
    agent_seconds: float | None  # time spent inside the agent process
    detail: str | None  # last stderr lines, k8s message, ...

    def __post_init__(self) -> None:
        if self.state not in (SUCCEEDED, FAILED):
            raise ValueError(f"RunResult.state must be SUCCEEDED or FAILED, got {self.state!r}")
        if self.state == FAILED and self.reason not in FAILURE_REASONS:
            raise ValueError(
                f"RunResult.reason {self.reason!r} is not a known failure reason; "
                f"use one of {sorted(FAILURE_REASONS)}"
            )

    def finish_body(self) -> dict[str, Any]:
        """The JSON body of ``POST .../finish``."""
        return asdict(self)

    @classmethod
    def succeeded(
        cls, *, exit_code: int | None = 0, agent_seconds: float | None = None, detail: str | None = None
    ) -> RunResult:
        return cls(SUCCEEDED, None, exit_code, agent_seconds, detail)

    @classmethod
    def failed(
        cls,
        reason: FailureReason,
        *,
        exit_code: int | None = None,
        agent_seconds: float | None = None,
        detail: str | None = None,
    ) -> RunResult:
        return cls(FAILED, reason, exit_code, agent_seconds, detail)


@runtime_checkable
class Runner(Protocol):
    """Runs one claimed attempt to a terminal state, enforcing ``claim.deadline_s``."""

    name: str

    async def start(self) -> None: ...

    async def run(self, claim: Claim) -> RunResult: ...

    async def close(self) -> None:
        """End everything this runner started, by id (pid, Job name)."""
        ...
