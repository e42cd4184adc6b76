"""The store's tables. `CREATE ... IF NOT EXISTS` throughout: opening an existing file keeps it
as it is, and a new file gets every table at once."""

from __future__ import annotations

SCHEMA = """
CREATE TABLE IF NOT EXISTS rollouts (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    rollout_id TEXT NOT NULL UNIQUE,
    group_id TEXT,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    latest_attempt INTEGER NOT NULL,
    reward REAL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS rollouts_by_state ON rollouts(state, seq);
CREATE INDEX IF NOT EXISTS rollouts_by_group ON rollouts(group_id, seq);
CREATE TABLE IF NOT EXISTS attempts (
    rollout_id TEXT NOT NULL,
    attempt_no INTEGER NOT NULL,
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    controller_id TEXT,
    reason TEXT,
    exit_code INTEGER,
    agent_seconds REAL,
    detail TEXT,
    lease_expires_at REAL,
    token_nonce TEXT,
    PRIMARY KEY (rollout_id, attempt_no)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS attempts_by_lease ON attempts(state, lease_expires_at);
CREATE INDEX IF NOT EXISTS attempts_by_controller ON attempts(controller_id, state);
CREATE TABLE IF NOT EXISTS events (
    event_id INTEGER PRIMARY KEY AUTOINCREMENT,
    rollout_id TEXT NOT NULL,
    attempt_no INTEGER NOT NULL,
    event_type TEXT NOT NULL,
    data TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_rollout ON events(rollout_id, event_id);
CREATE TABLE IF NOT EXISTS calls (
    call_id INTEGER PRIMARY KEY AUTOINCREMENT,
    rollout_id TEXT NOT NULL,
    attempt_no INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    request BLOB NOT NULL,
    response BLOB,
    prompt_token_ids BLOB NOT NULL,
    response_token_ids BLOB NOT NULL,
    response_logprobs BLOB NOT NULL,
    latency_s REAL NOT NULL,
    policy_version INTEGER,
    endpoint TEXT,
    status_code INTEGER NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS calls_by_rollout ON calls(rollout_id, attempt_no, seq);
CREATE TABLE IF NOT EXISTS terminal (
    cursor INTEGER PRIMARY KEY AUTOINCREMENT,
    rollout_id TEXT NOT NULL,
    attempt_no INTEGER NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS trained (
    run TEXT NOT NULL,
    step INTEGER NOT NULL,
    rollout_id TEXT NOT NULL,
    attempt_no INTEGER NOT NULL,
    trained_at REAL NOT NULL,
    rolled_back_at REAL
);
CREATE UNIQUE INDEX IF NOT EXISTS trained_once ON trained(rollout_id) WHERE rolled_back_at IS NULL;
CREATE INDEX IF NOT EXISTS trained_by_step ON trained(run, step);
CREATE TABLE IF NOT EXISTS run_leases (
    run TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    acquired_at REAL NOT NULL,
    renewed_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    released_at REAL,
    previous_owner TEXT
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""

#: Columns added after a table's first version: (table, column, declaration). A file made before
#: gets them at open (`ALTER TABLE ... ADD COLUMN`), empty in the rows it has.
ADDED_COLUMNS: tuple[tuple[str, str, str], ...] = (
    # the nonce its attempt token is bound to, drawn at claim (calcx.api.tokens)
    ("attempts", "token_nonce", "TEXT"),
)
