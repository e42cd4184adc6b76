"""What the trainer makes of a finished rollout: one sample per recorded model call, or the reason
the rollout cannot be trained on (`RolloutIncomplete`, which leaves its GRPO group out of the
step instead of training it as reward 0). Plain data: no verl, no torch, no ray."""

from __future__ import annotations

from dataclasses import dataclass, field


class RolloutIncomplete(Exception):
    """This rollout (and so its GRPO group) must be left out of the training step."""

    def __init__(self, rollout_id: str, reason: str, detail: str = "") -> None:
        self.rollout_id = rollout_id
        self.reason = reason
        self.detail = detail
        super().__init__(f"rollout {rollout_id}: {reason}" + (f" ({detail})" if detail else ""))


@dataclass
class CallSample:
    """One model call (or several that continue each other), ready to become a verl AgentLoopOutput."""

    call_id: str
    seq: int
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    reward: float
    policy_version: int | None
    latency_s: float
    prompt_truncated: bool = False
    response_truncated: bool = False
    calls: int = 1  # the recorded calls this sample holds (calcx.trainer.rollouts.call_join joins them)


@dataclass
class RolloutSamples:
    """All samples of one rollout, plus what a metrics line needs."""

    rollout_id: str
    group_id: str | None
    attempt_id: str
    reward: float
    samples: list[CallSample]
    skipped_calls: int = 0
    min_policy_version: int | None = None
    max_policy_version: int | None = None
    counters: dict[str, int] = field(default_factory=dict)
