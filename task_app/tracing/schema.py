"""The SQLite schema: the old system's tracing_v3 tables and column names (docs/compatibility.md,
"Trace tables"), versioned.

Existing trace tooling reads our files, so table and column names are the old system's. Differences, none in
what a reader sees: no `embedding VECTOR` columns (libSQL-only), no analytics views,
`outcome_rewards.total_reward` is REAL (the seed truncated it to an integer), and seven of its indexes
are dropped (migration 3: they only slowed every write).

Versioning: `PRAGMA user_version` holds the number of migrations applied. `MIGRATIONS[i]` takes the file
from version i to i + 1; each runs in its own transaction together with the version bump, so a crash
mid-migration leaves the previous version. Statements use `IF NOT EXISTS`, so a database the seed
system created (version 0, same tables) migrates cleanly. Migrations are append-only: never edit one
that has shipped, add the next.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger(__name__)

_V1_TABLES = (
    """CREATE TABLE IF NOT EXISTS experiments (
        experiment_id VARCHAR PRIMARY KEY,
        name VARCHAR NOT NULL,
        description TEXT,
        created_at DATETIME DEFAULT CURRENT_TIMESTAMP,
        updated_at DATETIME DEFAULT CURRENT_TIMESTAMP,
        configuration TEXT,
        metadata TEXT
    )""",
    """CREATE TABLE IF NOT EXISTS systems (
        system_id VARCHAR PRIMARY KEY,
        name VARCHAR NOT NULL,
        system_type VARCHAR,
        description TEXT,
        created_at DATETIME DEFAULT CURRENT_TIMESTAMP,
        metadata TEXT
    )""",
    """CREATE TABLE IF NOT EXISTS system_versions (
        version_id VARCHAR PRIMARY KEY,
        system_id VARCHAR NOT NULL REFERENCES systems(system_id),
        version_number VARCHAR NOT NULL,
        commit_hash VARCHAR,
        created_at DATETIME DEFAULT CURRENT_TIMESTAMP,
        configuration TEXT,
        metadata TEXT,
        UNIQUE(system_id, version_number)
    )""",
    """CREATE TABLE IF NOT EXISTS experimental_systems (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        experiment_id VARCHAR NOT NULL REFERENCES experiments(experiment_id),
        system_id VARCHAR NOT NULL REFERENCES systems(system_id),
        version_id VARCHAR NOT NULL REFERENCES system_versions(version_id)
    )""",
    """CREATE TABLE IF NOT EXISTS session_traces (
        session_id VARCHAR PRIMARY KEY,
        created_at DATETIME NOT NULL,
        num_timesteps INTEGER NOT NULL,
        num_events INTEGER NOT NULL,
        num_messages INTEGER NOT NULL,
        metadata TEXT,
        experiment_id VARCHAR REFERENCES experiments(experiment_id)
    )""",
    """CREATE TABLE IF NOT EXISTS session_timesteps (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id VARCHAR NOT NULL REFERENCES session_traces(session_id),
        step_id VARCHAR NOT NULL,
        step_index INTEGER NOT NULL,
        turn_number INTEGER,
        started_at DATETIME,
        completed_at DATETIME,
        num_events INTEGER,
        num_messages INTEGER,
        step_metadata TEXT,
        UNIQUE(session_id, step_id)
    )""",
    """CREATE TABLE IF NOT EXISTS events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id VARCHAR NOT NULL REFERENCES session_traces(session_id),
        timestep_id INTEGER REFERENCES session_timesteps(id),
        event_type VARCHAR NOT NULL CHECK (event_type IN ('cais', 'environment', 'runtime')),
        system_instance_id VARCHAR,
        event_time FLOAT,
        message_time INTEGER,
        created_at DATETIME,
        model_name VARCHAR,
        provider VARCHAR,
        input_tokens INTEGER,
        output_tokens INTEGER,
        total_tokens INTEGER,
        cost_usd INTEGER,
        latency_ms INTEGER,
        span_id VARCHAR,
        trace_id VARCHAR,
        call_records TEXT,
        reward FLOAT,
        terminated BOOLEAN,
        truncated BOOLEAN,
        system_state_before TEXT,
        system_state_after TEXT,
        metadata TEXT,
        event_metadata TEXT
    )""",
    """CREATE TABLE IF NOT EXISTS messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id VARCHAR NOT NULL REFERENCES session_traces(session_id),
        timestep_id INTEGER REFERENCES session_timesteps(id),
        message_type VARCHAR NOT NULL
            CHECK (message_type IN ('user', 'assistant', 'system', 'tool_use', 'tool_result')),
        content TEXT NOT NULL,
        timestamp DATETIME,
        event_time FLOAT,
        message_time INTEGER,
        metadata TEXT
    )""",
    """CREATE TABLE IF NOT EXISTS outcome_rewards (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id VARCHAR NOT NULL REFERENCES session_traces(session_id),
        total_reward REAL NOT NULL,
        achievements_count INTEGER NOT NULL,
        total_steps INTEGER NOT NULL,
        created_at DATETIME NOT NULL,
        reward_metadata TEXT
    )""",
    """CREATE TABLE IF NOT EXISTS event_rewards (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        event_id INTEGER NOT NULL REFERENCES events(id),
        session_id VARCHAR NOT NULL REFERENCES session_traces(session_id),
        message_id INTEGER REFERENCES messages(id),
        turn_number INTEGER,
        reward_value FLOAT NOT NULL,
        reward_type VARCHAR,
        "key" VARCHAR,
        annotation TEXT,
        source VARCHAR,
        created_at DATETIME NOT NULL
    )""",
)

_V1_INDEXES = (
    "CREATE INDEX IF NOT EXISTS idx_session_created ON session_traces (created_at)",
    "CREATE INDEX IF NOT EXISTS idx_session_experiment ON session_traces (experiment_id)",
    "CREATE INDEX IF NOT EXISTS idx_timestep_session_step ON session_timesteps (session_id, step_id)",
    "CREATE INDEX IF NOT EXISTS idx_timestep_turn ON session_timesteps (turn_number)",
    "CREATE INDEX IF NOT EXISTS idx_event_session_step ON events (session_id, timestep_id)",
    "CREATE INDEX IF NOT EXISTS idx_event_type ON events (event_type)",
    "CREATE INDEX IF NOT EXISTS idx_event_created ON events (created_at)",
    "CREATE INDEX IF NOT EXISTS idx_event_model ON events (model_name)",
    "CREATE INDEX IF NOT EXISTS idx_event_trace ON events (trace_id)",
    "CREATE INDEX IF NOT EXISTS idx_message_session_step ON messages (session_id, timestep_id)",
    "CREATE INDEX IF NOT EXISTS idx_message_type ON messages (message_type)",
    "CREATE INDEX IF NOT EXISTS idx_message_timestamp ON messages (timestamp)",
    "CREATE INDEX IF NOT EXISTS idx_experiment_created ON experiments (created_at)",
    "CREATE INDEX IF NOT EXISTS idx_experiment_name ON experiments (name)",
    "CREATE INDEX IF NOT EXISTS idx_system_name ON systems (name)",
    "CREATE INDEX IF NOT EXISTS idx_system_type ON systems (system_type)",
    "CREATE INDEX IF NOT EXISTS idx_version_system ON system_versions (system_id)",
    "CREATE INDEX IF NOT EXISTS idx_experimental_system ON experimental_systems (experiment_id, system_id)",
    "CREATE INDEX IF NOT EXISTS idx_outcome_rewards_session ON outcome_rewards (session_id)",
    "CREATE INDEX IF NOT EXISTS idx_outcome_rewards_total ON outcome_rewards (total_reward)",
    "CREATE INDEX IF NOT EXISTS idx_event_rewards_session ON event_rewards (session_id)",
    "CREATE INDEX IF NOT EXISTS idx_event_rewards_event ON event_rewards (event_id)",
    "CREATE INDEX IF NOT EXISTS idx_event_rewards_type ON event_rewards (reward_type)",
    'CREATE INDEX IF NOT EXISTS idx_event_rewards_key ON event_rewards ("key")',
)

Migration = tuple[str, ...]

# Replacing a session's rows deletes its timesteps and messages; with foreign keys enforced SQLite then
# looks up the child rows by these columns, which scanned the whole table without their own indexes
# (the cost of a replayed run_id grew with the database).
_V2_FOREIGN_KEY_INDEXES: Migration = (
    "CREATE INDEX IF NOT EXISTS idx_event_timestep ON events (timestep_id)",
    "CREATE INDEX IF NOT EXISTS idx_message_timestep ON messages (timestep_id)",
    "CREATE INDEX IF NOT EXISTS idx_event_rewards_message ON event_rewards (message_id)",
)

# Seed indexes that only cost writes. Every decision adds a timestep, two events and four messages, and
# each row goes into every index of its table; no read here uses these (sessions are found by id or
# their own created_at, a session's rows by session_id): a copy of the timesteps' UNIQUE (session_id,
# step_id) index, three over columns of a handful of values (event and message type, turn number;
# idx_event_type even misled the planner: rows.py `_ENV_EVENT_ID`), and the events' creation time and
# model, the messages' timestamp (docs/decisions/trace-writer.md has what they cost). A tool that
# wants one back creates it (the old system's own start-up does, IF NOT EXISTS).
WRITE_ONLY_INDEXES = (
    "idx_timestep_session_step",
    "idx_timestep_turn",
    "idx_event_type",
    "idx_event_created",
    "idx_event_model",
    "idx_message_type",
    "idx_message_timestamp",
)
_V3_WRITE_ONLY_INDEXES: Migration = tuple(f"DROP INDEX IF EXISTS {name}" for name in WRITE_ONLY_INDEXES)

MIGRATIONS: tuple[Migration, ...] = (
    _V1_TABLES + _V1_INDEXES,  # 0 -> 1: the seed's tables, indexes
    _V2_FOREIGN_KEY_INDEXES,  # 1 -> 2: indexes for the foreign keys a session delete checks
    _V3_WRITE_ONLY_INDEXES,  # 2 -> 3: seed indexes that no read uses, dropped
)
SCHEMA_VERSION = len(MIGRATIONS)

# Child tables first, so a session can be deleted where foreign keys are enforced (the seed's tools).
SESSION_TABLES = ("event_rewards", "messages", "events", "session_timesteps", "outcome_rewards", "session_traces")


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """`BEGIN IMMEDIATE` … `COMMIT`, rolled back on any error (the connection is in autocommit mode).

    IMMEDIATE takes the write lock up front, so a busy file fails (after `busy_timeout`) at BEGIN
    rather than half-way through the inserts.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise


def _rollback(conn: sqlite3.Connection) -> None:
    if not conn.in_transaction:  # SQLite may already have rolled back (e.g. on SQLITE_FULL)
        return
    try:
        conn.execute("ROLLBACK")
    except sqlite3.Error:
        logger.warning("trace database rollback failed", exc_info=True)


def migrate(conn: sqlite3.Connection, migrations: tuple[Migration, ...] = MIGRATIONS) -> int:
    """Apply the migrations the file lacks, in order; return the resulting version.

    The connection must be in autocommit mode (`isolation_level=None`). A file from a newer release
    (version above ours) is left alone: migrations are additive, so our statements still work.
    """
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > len(migrations):
        logger.warning("trace database has schema version %d, newer than ours (%d)", version, len(migrations))
        return version
    for target in range(version + 1, len(migrations) + 1):
        with transaction(conn):
            for statement in migrations[target - 1]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {target:d}")
        logger.info("trace database migrated to schema version %d", target)
    return max(version, len(migrations))
