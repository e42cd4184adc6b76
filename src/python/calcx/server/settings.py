"""Every setting of the server and its default, written once.

`calcx server` builds its flags (and their `--help` defaults) from `DEFAULTS`; `create_app`,
`start_server_thread` and the gateway read the settings object they are given.
"""

from __future__ import annotations

from dataclasses import dataclass

from calcx.api.endpoints import POST_EVENT
from calcx.server.errors import BodyLimit


@dataclass(frozen=True)
class ServerSettings:
    key: str = ""  # the server key; required (create_app refuses an empty one)
    store_path: str = "calcx.db"  # the SQLite file; relative to the working directory
    host: str = "127.0.0.1"
    port: int = 8000  # 0 picks a free port
    public_url: str | None = None  # the base URL agents use; None: http://HOST:PORT as bound
    log_level: str = "info"
    access_log: bool = False
    # requests
    max_body_bytes: int = 8 * 1024 * 1024  # every endpoint but those of BODY_LIMIT_SETTINGS
    max_event_body_bytes: int = 64 * 1024  # an event (a reward is a few dozen bytes)
    # connections and requests the HTTP server holds at once (uvicorn's limit_concurrency): past
    # it a new request is answered 503 at once, before the app sees it
    max_connections: int = 4096
    # a connection that has not sent a whole request head (line and headers) this long after it
    # opened, or after its next request's first byte, is closed (calcx.server.request_head): one
    # that trickles its head would otherwise hold one of max_connections for ever
    request_head_timeout_s: float = 10.0
    # JSON bodies nested deeper than this are refused (422): a tool's JSON schema nests a few
    # levels; thousands would exhaust the parser's stack
    max_json_depth: int = 64
    page_limit: int = 100  # GET /v1/rollouts and /v1/terminal without ?limit=
    max_page_limit: int = 1000
    # per attempt: past these an agent's next event or model call is refused (413 attempt_limit)
    max_events_per_attempt: int = 1000
    max_event_bytes_per_attempt: int = 1024 * 1024  # the events' data, as stored JSON
    max_calls_per_attempt: int = 256
    max_call_bytes_per_attempt: int = 64 * 1024 * 1024  # recorded requests and answers, as JSON bytes
    # requests in flight at once with one attempt's URLs (its gateway and events, whoever sends
    # them); past it 429 too_many_requests. An agent makes one model call at a time, and its client
    # may resend one it gave up on while the first is still upstream
    max_in_flight_per_attempt: int = 8
    # retention: a rollout terminal for longer than this is deleted with its attempts, events and
    # calls (checked every retain_check_s); 0 keeps everything
    retain_s: float = 7 * 24 * 3600.0
    retain_check_s: float = 60.0
    # claims and long polls
    lease_s: float = 30.0
    # a run's lease (calcx.server.store.run_leases): how long it lasts without a renewal, and how
    # many runs the store holds leases for (past it, ended leases make room; live ones are kept)
    run_lease_s: float = 30.0
    max_run_leases: int = 1000
    max_poll_s: float = 300.0  # every long poll is cut to this
    terminal_poll_s: float = 30.0  # GET /v1/terminal without ?timeout_s=
    # gateway
    max_tokens_ceiling: int = 4096
    upstream_timeout_s: float = 300.0
    upstream_connect_timeout_s: float = 5.0
    upstream_retries: int = 3
    upstream_backoff_s: float = 0.2  # doubled at each retry, with jitter
    upstream_backoff_max_s: float = 2.0
    # a model replica whose try failed gets no new rollout until it answers; it is asked
    # (GET {endpoint}/models) this often meanwhile (calcx.server.replicas)
    replica_probe_s: float = 2.0
    # rewards: a reward event's data.value outside [reward_min, reward_max] is refused (422) and
    # never stored, so the attempt is the agent's failure, not a trained reward (Calc-X: 0 or 1)
    reward_min: float = 0.0
    reward_max: float = 1.0
    # a call the model server aborted (finish reason "abort": generation paused for a weight
    # update) is sent again until this many seconds have passed since its first try, then the
    # aborted answer goes to the agent; 0: at once
    abort_retry_s: float = 120.0
    # the model servers' tool-call parser (vLLM's --tool-call-parser; "" = not known). With
    # "hermes", an earlier model turn goes back to the model as it wrote it (calcx.server.assistant_turns)
    tool_call_parser: str = ""

    def body_limit(self, endpoint_name: str) -> BodyLimit:
        """What the route of one endpoint (its `calcx.api.endpoints` name) reads of a request body."""
        setting = BODY_LIMIT_SETTINGS.get(endpoint_name, "max_body_bytes")
        return BodyLimit(getattr(self, setting), "--" + setting.replace("_", "-"), self.max_json_depth)

    def poll_timeout(self, requested: float) -> float:
        """A client's long-poll timeout, cut to [0, max_poll_s]."""
        return max(0.0, min(float(requested), self.max_poll_s))

    @property
    def lease_check_s(self) -> float:
        """How often expired leases are looked for: a few times per lease, at most once a second."""
        return max(0.05, min(1.0, self.lease_s / 4))


#: Endpoints (by their name in calcx.api.endpoints) whose bodies have a limit of their own, and the
#: setting that holds it; every other endpoint reads up to max_body_bytes (the gateway's calls,
#: a batch of rollouts).
BODY_LIMIT_SETTINGS: dict[str, str] = {POST_EVENT.name: "max_event_body_bytes"}

DEFAULTS = ServerSettings()
