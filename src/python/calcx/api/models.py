"""Pydantic models of the calcx HTTP API (see docs/architecture.md).

The server validates request bodies with these models and the clients parse answers with them,
so both sides share one definition of every field.
"""

from __future__ import annotations

import math
from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from calcx.contract.env import (
    REQUIRED_ROW_VARIABLES,
    RESULT_REL_TOL,
    env_problem,
    env_value,
    parse_rel_tol,
    reserved_problem,
    rollout_env_map,
    unmapped_variables,
)
from calcx.contract.failures import FAILURE_REASONS, FailureReason

RolloutState = Literal["QUEUED", "RUNNING", "SUCCEEDED", "FAILED"]
TerminalState = Literal["SUCCEEDED", "FAILED"]
TERMINAL_STATES: frozenset[str] = frozenset({"SUCCEEDED", "FAILED"})
ROLLOUT_STATES: tuple[RolloutState, ...] = get_args(RolloutState)

# Rollout ids travel in URL paths and in attempt tokens, so they keep to a URL-safe alphabet.
ROLLOUT_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,200}$"
#: Ids of that alphabet that are path segments of their own: a client normalises `/v1/rollouts/..`
#: to another URL, so such a rollout could never be read, waited on or called back.
DOT_SEGMENTS: frozenset[str] = frozenset({".", ".."})


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _StrictBody(BaseModel):
    """Request bodies: unknown fields are an error, so typos do not pass silently."""

    model_config = ConfigDict(extra="forbid")


_INT64 = 2**63


def _number(**bounds: Any) -> Any:
    """An optional finite JSON number in range; strict, so "0.7" and true are refused."""
    return Field(default=None, strict=True, allow_inf_nan=False, **bounds)


class Sampling(_StrictBody):
    """Sampling parameters the gateway applies to every model call of one rollout, overriding the
    agent's: the trainer's sampling distribution must be what vLLM samples, since the recorded
    log-probs are trained on. Ranges are vLLM's (and OpenAI's); a field left out is not touched."""

    temperature: float | None = _number(ge=0, le=2)
    top_p: float | None = _number(gt=0, le=1)
    top_k: int | None = _number(ge=-1)  # 0 (or -1) = off, as vLLM reads it
    min_p: float | None = _number(ge=0, le=1)
    repetition_penalty: float | None = _number(gt=0)
    presence_penalty: float | None = _number(ge=-2, le=2)
    frequency_penalty: float | None = _number(ge=-2, le=2)
    seed: int | None = _number(ge=-_INT64, lt=_INT64)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        """Name the unknown key and the allowed ones (pydantic's own message names neither list)."""
        if isinstance(data, dict):
            unknown = sorted(str(k) for k in data if k not in cls.model_fields)
            if unknown:
                raise ValueError(
                    f"unknown sampling parameter(s) {', '.join(repr(k) for k in unknown)}; "
                    f"allowed: {', '.join(cls.model_fields)}"
                )
        return data

    @model_serializer(mode="wrap")
    def _given_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Only the parameters given: what is stored and shown is what the gateway applies."""
        return {k: v for k, v in handler(self).items() if v is not None}


class RolloutCreate(_StrictBody):
    rollout_id: str = Field(pattern=ROLLOUT_ID_PATTERN)
    group_id: str | None = None
    row: dict[str, Any]
    env_map: dict[str, str] | None = None
    deadline_s: float = Field(default=300.0, gt=0, le=7 * 24 * 3600)
    max_attempts: int = Field(default=3, ge=1, le=100)
    policy_version: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    sampling: Sampling | None = None

    @field_validator("rollout_id")
    @classmethod
    def _not_a_dot_segment(cls, value: str) -> str:
        if value in DOT_SEGMENTS:
            raise ValueError(
                f"rollout id {value!r} is a URL dot segment (a client would rewrite the path); "
                "use letters, digits or other characters of [A-Za-z0-9._:-] too"
            )
        return value

    @model_validator(mode="after")
    def _carriable_env(self) -> RolloutCreate:
        """Refuse a row that no runner could hand to an agent (calcx.contract.env's rule) now,
        rather than let a runner find out at every attempt, and an env_map that sets a reserved
        variable (the calculator command, the attempt token, PATH...) or leaves out one the agent
        needs from its row. A missing field is the server's own check, with its own message."""
        env_map = rollout_env_map(self.env_map)
        unmapped = unmapped_variables(env_map)
        if unmapped:
            raise ValueError(
                f"rollout {self.rollout_id!r}: env_map maps no row field to {', '.join(unmapped)} (an env_map "
                f"replaces the default one and must map {', '.join(REQUIRED_ROW_VARIABLES)}; leave it out, "
                "or null, for the default)"
            )
        for var, column in env_map.items():
            reserved = reserved_problem(var)
            if reserved is not None:
                raise ValueError(f"rollout {self.rollout_id!r}: env_map key {var!r} is refused: {reserved}")
            problem = env_problem(var, env_value(self.row[column]) if column in self.row else "")
            if problem is not None:
                raise ValueError(f"rollout {self.rollout_id!r}: row field {column!r} (as {var}): {problem}")
            if var == RESULT_REL_TOL and self.row.get(column) is not None:  # else the agent fails every attempt
                parse_rel_tol(self.row[column], what=f"rollout {self.rollout_id!r}: row field {column!r} (as {var})")
        return self


class CreateRolloutsRequest(_StrictBody):
    rollouts: list[RolloutCreate] = Field(min_length=1, max_length=10_000)


class Attempt(_Model):
    attempt_id: str
    state: RolloutState
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    controller_id: str | None = None
    reason: str | None = None
    exit_code: int | None = None
    agent_seconds: float | None = None
    detail: str | None = None
    lease_expires_at: float | None = None
    #: what the attempt's token is bound to (calcx.api.tokens), drawn at its claim; not a secret
    token_nonce: str | None = None


class Event(_Model):
    event_id: int
    attempt_id: str
    event_type: str
    data: dict[str, Any]
    created_at: float


class Rollout(_Model):
    rollout_id: str
    group_id: str | None = None
    row: dict[str, Any]
    env_map: dict[str, str] | None = None
    deadline_s: float = 300.0
    max_attempts: int = 3
    policy_version: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    sampling: dict[str, float | int] | None = None  # RolloutCreate's, as validated and stored
    state: RolloutState
    attempts: list[Attempt]
    reward: float | None = None
    events: list[Event] = Field(default_factory=list)
    created_at: float

    @property
    def latest_attempt(self) -> Attempt:
        return self.attempts[-1]

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES


class RolloutList(_Model):
    rollouts: list[Rollout]


class WaitRequest(_StrictBody):
    timeout_s: float = Field(default=30.0, ge=0)


class TerminalItem(_Model):
    cursor: int
    attempt_id: str
    rollout: Rollout


class TerminalPage(_Model):
    items: list[TerminalItem]
    next: int


class ClaimRequest(_StrictBody):
    controller_id: str = Field(min_length=1, max_length=200)
    max: int = Field(default=1, ge=1, le=1000)
    timeout_s: float = Field(default=10.0, ge=0)


class Claim(_Model):
    rollout: Rollout
    attempt_id: str
    token: str
    env: dict[str, str]
    deadline_s: float


class ClaimsResponse(_Model):
    claims: list[Claim]
    lease_s: float


class AttemptRef(_Model):
    rollout_id: str
    attempt_id: str


class HeartbeatRequest(_StrictBody):
    controller_id: str = Field(min_length=1, max_length=200)
    attempts: list[AttemptRef] | None = None


class LostAttempt(AttemptRef):
    """An attempt a heartbeat listed that is no longer RUNNING under that controller. `reason`:
    its failure reason when the server failed it (`cancelled`, `controller_lost`, ...), else None
    (unknown, another controller's, or finished)."""

    reason: str | None = None


class HeartbeatResponse(_Model):
    lease_s: float
    held: list[AttemptRef]
    lost: list[LostAttempt]


#: The most rollout ids one cancel request may name.
MAX_CANCEL_IDS = 10_000


def _run_name() -> Any:
    """A run name, as labels, the ledger and run leases carry it."""
    return Field(min_length=1, max_length=200)


def _lease_owner() -> Any:
    """The owner id of a run's lease (drawn by each trainer process), on the writes it fences."""
    return Field(default=None, min_length=1, max_length=200)


class CancelRequest(_StrictBody):
    """Cancel the QUEUED and RUNNING attempts of one run (`run`) or of the rollouts named. A
    cancel by run names the lease `owner` of the trainer sending it (refused when another trainer
    holds the run's lease)."""

    run: str | None = Field(default=None, min_length=1, max_length=200)
    rollout_ids: list[str] | None = Field(default=None, min_length=1, max_length=MAX_CANCEL_IDS)
    detail: str | None = Field(default=None, max_length=1000)
    owner: str | None = _lease_owner()

    @model_validator(mode="after")
    def _one_target(self) -> CancelRequest:
        if (self.run is None) == (self.rollout_ids is None):
            raise ValueError("name what to cancel: either run (a run label) or rollout_ids, not both")
        return self


class CancelResponse(_Model):
    cancelled: list[AttemptRef]


#: The most rollouts one step of the training ledger may name.
MAX_TRAINED_IDS = 10_000


class TrainedRequest(_StrictBody):
    """Step `step` of run `run` trained these rollouts (their latest, SUCCEEDED attempts); `owner`:
    the sending trainer's lease owner id."""

    run: str = _run_name()
    step: int = Field(ge=0, le=2**31)
    rollout_ids: list[str] = Field(min_length=1, max_length=MAX_TRAINED_IDS)
    owner: str | None = _lease_owner()


class TrainedResponse(_Model):
    run: str
    step: int
    recorded: int


class RewindRequest(_StrictBody):
    """A run resumed from the checkpoint of `after_step`: its later steps' weights are gone."""

    run: str = _run_name()
    after_step: int = Field(ge=0, le=2**31)
    owner: str | None = _lease_owner()


class RewindResponse(_Model):
    run: str
    after_step: int
    #: the steps whose records became rolled back
    rolled_back: list[int]


class RetryRequest(_StrictBody):
    """`force`: retry a rollout the cancel API ended (its work was withdrawn) all the same."""

    force: bool = False


class LeaseRequest(_StrictBody):
    """Take run `run`'s lease for trainer `owner`; `take_over` a live lease of another trainer."""

    run: str = _run_name()
    owner: str = Field(min_length=1, max_length=200)
    take_over: bool = False


class LeaseRenewal(_StrictBody):
    """Renew (or release) `owner`'s lease of run `run`."""

    run: str = _run_name()
    owner: str = Field(min_length=1, max_length=200)


class RunLease(_Model):
    """A run's lease: its holder, and when it lapses unless renewed (wall time)."""

    run: str
    owner: str
    lease_s: float
    expires_at: float
    acquired_at: float
    renewed_at: float
    released_at: float | None = None
    #: the owner before this one (the trainer taken over, or the previous run)
    previous_owner: str | None = None
    live: bool = True
    #: in a take's answer: it ended another trainer's live lease
    took_over: bool = False


class FinishRequest(_StrictBody):
    state: TerminalState
    reason: str | None = None
    exit_code: int | None = None
    agent_seconds: float | None = Field(default=None, ge=0)
    detail: str | None = Field(default=None, max_length=64_000)

    @field_validator("reason")
    @classmethod
    def _known_reason(cls, value: str | None) -> str | None:
        if value is not None and value not in FAILURE_REASONS:
            raise ValueError(f"unknown failure reason {value!r}; use one of {sorted(FAILURE_REASONS)}")
        if value == FailureReason.CANCELLED_BY_API:
            raise ValueError(
                f"{value!r} is set by the server's cancel API only (a controller that stops an "
                f"attempt reports {FailureReason.CANCELLED.value!r})"
            )
        return value


class EventCreate(_StrictBody):
    event_type: str = Field(min_length=1, max_length=100)
    data: dict[str, Any] = Field(default_factory=dict)


class EventCreated(_Model):
    event_id: int


def reward_value(data: dict[str, Any]) -> float:
    """The finite float in a reward event's `data.value`; ValueError says what is wrong."""
    if "value" not in data:
        raise ValueError('a reward event needs data.value, e.g. {"event_type": "reward", "data": {"value": 1.0}}')
    value = data["value"]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"data.value must be a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError("data.value must be a finite number (not NaN or infinity)")
    return value


class RecordedCall(_Model):
    call_id: int
    rollout_id: str
    attempt_id: str
    seq: int
    request: dict[str, Any]
    response: dict[str, Any] | None = None
    prompt_token_ids: list[int] = Field(default_factory=list)
    response_token_ids: list[int] = Field(default_factory=list)
    response_logprobs: list[float] = Field(default_factory=list)
    latency_s: float
    policy_version: int | None = None
    endpoint: str | None = None
    status_code: int
    created_at: float


class CallList(_Model):
    calls: list[RecordedCall]


class ModelRegistryUpdate(_StrictBody):
    model: str = Field(min_length=1, max_length=500)
    endpoints: list[str] = Field(min_length=1, max_length=1000)
    policy_version: int = 0

    @field_validator("endpoints")
    @classmethod
    def _http_urls(cls, value: list[str]) -> list[str]:
        cleaned = []
        for url in value:
            if not (url.startswith("http://") or url.startswith("https://")):
                raise ValueError(f"endpoint {url!r} must be an http(s) base URL such as http://host:8000/v1")
            cleaned.append(url.rstrip("/"))
        return cleaned


class ModelRegistry(_Model):
    model: str | None = None
    endpoints: list[str] = Field(default_factory=list)
    policy_version: int | None = None
    updated_at: float | None = None


class Health(_Model):
    status: str  # "ok" (200) or "unavailable" (503)
    version: str
    store: str | None = None  # "writable", or why the store cannot write (from a write probe)
