"""The server's HTTP API as one table: every endpoint, who calls it, its auth, body and answer.

Both ends are built from this table: `calcx.api.client` sends every request through a row of it,
and the server attaches each handler to a row (`calcx.server.routing`), which gives the route its
method, path, audience and body model. Paths are templates: `{rid}` is a rollout id, `{aid}` an
attempt id (quoted when filled).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from urllib.parse import quote

from pydantic import BaseModel

from calcx.api.models import (
    CallList,
    CancelRequest,
    CancelResponse,
    ClaimRequest,
    ClaimsResponse,
    CreateRolloutsRequest,
    EventCreate,
    EventCreated,
    FinishRequest,
    Health,
    HeartbeatRequest,
    HeartbeatResponse,
    LeaseRenewal,
    LeaseRequest,
    ModelRegistry,
    ModelRegistryUpdate,
    RetryRequest,
    RewindRequest,
    RewindResponse,
    Rollout,
    RolloutList,
    RunLease,
    TerminalPage,
    TrainedRequest,
    TrainedResponse,
    WaitRequest,
)

#: A long poll's read timeout is the time the server may hold it plus this margin.
POLL_MARGIN_S = 15.0
#: The gateway waits for the policy's inference server, retries included.
GATEWAY_TIMEOUT_S = 600.0


class Auth(str, Enum):
    """Which bearer token an endpoint takes (docs/architecture.md, Auth)."""

    OPEN = "none"
    SERVER_KEY = "server key"
    ATTEMPT = "attempt token or server key"


@dataclass(frozen=True)
class Endpoint:
    """One endpoint, declared once: the client calls through it and the server serves it."""

    name: str
    method: str
    path: str
    auth: Auth
    callers: str
    #: the body the server validates with (None: no body, or one the gateway passes on)
    request: type[BaseModel] | None
    #: the answer's model (None: the answer as it comes, JSON or text)
    response: type[BaseModel] | None
    status: int = 200
    #: long poll: the server holds the answer up to the request's `timeout_s`
    long_poll: bool = False
    #: a read timeout of its own instead of the client's
    timeout_s: float | None = None
    #: an empty body stands for the request model's defaults
    body_optional: bool = False

    def path_for(self, **params: str) -> str:
        return self.path.format(**{name: quote(str(value), safe="") for name, value in params.items()})


HEALTH = Endpoint("health", "GET", "/healthz", Auth.OPEN, "probes, tests", None, Health)
METRICS = Endpoint("metrics", "GET", "/metrics", Auth.OPEN, "Prometheus", None, None)
CREATE_ROLLOUTS = Endpoint(
    "create_rollouts",
    "POST",
    "/v1/rollouts",
    Auth.SERVER_KEY,
    "trainer, rehearsal, benchmarks",
    CreateRolloutsRequest,
    RolloutList,
)
LIST_ROLLOUTS = Endpoint(
    "list_rollouts",
    "GET",
    "/v1/rollouts",
    Auth.SERVER_KEY,
    "trainer (preflight, evaluation), benchmarks",
    None,
    RolloutList,
)
GET_ROLLOUT = Endpoint("get_rollout", "GET", "/v1/rollouts/{rid}", Auth.SERVER_KEY, "tests, tools", None, Rollout)
WAIT = Endpoint(
    "wait",
    "POST",
    "/v1/rollouts/{rid}/wait",
    Auth.SERVER_KEY,
    "trainer",
    WaitRequest,
    Rollout,
    long_poll=True,
    body_optional=True,
)
RETRY = Endpoint(
    "retry",
    "POST",
    "/v1/rollouts/{rid}/retry",
    Auth.SERVER_KEY,
    "trainer, tools (force)",
    RetryRequest,
    Rollout,
    body_optional=True,
)
CANCEL = Endpoint(
    "cancel",
    "POST",
    "/v1/cancel",
    Auth.SERVER_KEY,
    "trainer (what a previous run left), tools",
    CancelRequest,
    CancelResponse,
)
RECORD_TRAINED = Endpoint(
    "record_trained",
    "POST",
    "/v1/trained",
    Auth.SERVER_KEY,
    "trainer (after each step's update)",
    TrainedRequest,
    TrainedResponse,
)
REWIND = Endpoint(
    "rewind",
    "POST",
    "/v1/trained/rewind",
    Auth.SERVER_KEY,
    "trainer (resuming from a checkpoint)",
    RewindRequest,
    RewindResponse,
)
ACQUIRE_LEASE = Endpoint(
    "acquire_lease",
    "POST",
    "/v1/leases",
    Auth.SERVER_KEY,
    "trainer (at start, before it cancels or rewinds)",
    LeaseRequest,
    RunLease,
)
RENEW_LEASE = Endpoint(
    "renew_lease",
    "POST",
    "/v1/leases/renew",
    Auth.SERVER_KEY,
    "trainer (while it runs)",
    LeaseRenewal,
    RunLease,
)
RELEASE_LEASE = Endpoint(
    "release_lease",
    "POST",
    "/v1/leases/release",
    Auth.SERVER_KEY,
    "trainer (at a clean end)",
    LeaseRenewal,
    RunLease,
)
CALLS = Endpoint("calls", "GET", "/v1/rollouts/{rid}/calls", Auth.SERVER_KEY, "trainer", None, CallList)
TERMINAL = Endpoint(
    "terminal",
    "GET",
    "/v1/terminal",
    Auth.SERVER_KEY,
    "rehearsal, benchmarks",
    None,
    TerminalPage,
    long_poll=True,
)
CLAIM = Endpoint(
    "claim",
    "POST",
    "/v1/claims",
    Auth.SERVER_KEY,
    "controller",
    ClaimRequest,
    ClaimsResponse,
    long_poll=True,
)
HEARTBEAT = Endpoint(
    "heartbeat",
    "POST",
    "/v1/claims/heartbeat",
    Auth.SERVER_KEY,
    "controller",
    HeartbeatRequest,
    HeartbeatResponse,
)
FINISH = Endpoint(
    "finish",
    "POST",
    "/v1/rollouts/{rid}/attempts/{aid}/finish",
    Auth.SERVER_KEY,
    "controller",
    FinishRequest,
    Rollout,
)
POST_EVENT = Endpoint(
    "post_event",
    "POST",
    "/v1/rollouts/{rid}/attempts/{aid}/events",
    Auth.ATTEMPT,
    "agent ($AGL_EVENT_URL)",
    EventCreate,
    EventCreated,
)
CHAT_COMPLETIONS = Endpoint(
    "chat_completions",
    "POST",
    "/v1/rollouts/{rid}/attempts/{aid}/v1/chat/completions",
    Auth.ATTEMPT,
    "agent (OpenAI client at $AGL_OPENAI_BASE_URL)",
    None,
    None,
    timeout_s=GATEWAY_TIMEOUT_S,
)
OPENAI_MODELS = Endpoint(
    "openai_models",
    "GET",
    "/v1/rollouts/{rid}/attempts/{aid}/v1/models",
    Auth.ATTEMPT,
    "agent (OpenAI client at $AGL_OPENAI_BASE_URL)",
    None,
    None,
)
PUT_MODELS = Endpoint(
    "put_models",
    "PUT",
    "/v1/models",
    Auth.SERVER_KEY,
    "trainer, rehearsal",
    ModelRegistryUpdate,
    ModelRegistry,
)
GET_MODELS = Endpoint("get_models", "GET", "/v1/models", Auth.SERVER_KEY, "tests, tools", None, ModelRegistry)

ENDPOINTS: tuple[Endpoint, ...] = (
    HEALTH,
    METRICS,
    CREATE_ROLLOUTS,
    LIST_ROLLOUTS,
    GET_ROLLOUT,
    WAIT,
    RETRY,
    CANCEL,
    RECORD_TRAINED,
    REWIND,
    ACQUIRE_LEASE,
    RENEW_LEASE,
    RELEASE_LEASE,
    CALLS,
    TERMINAL,
    CLAIM,
    HEARTBEAT,
    FINISH,
    POST_EVENT,
    CHAT_COMPLETIONS,
    OPENAI_MODELS,
    PUT_MODELS,
    GET_MODELS,
)
