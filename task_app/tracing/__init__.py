"""Traces and training data: v3 trace payloads, the durable SQLite store, SFT JSONL files.

trace.py   RolloutResult -> compact | structured | full payloads (pure)
calls.py   LMCall -> tracing_v3 LLMCallRecord; message/content helpers
rows.py    SessionTrace <-> rows of the seed's tables
schema.py  DDL, PRAGMA user_version migrations
store.py   TraceStore: one connection, one writer task, one transaction per queued batch
sft.py     SFT records and the atomic per-run JSONL writer
token_records.py  exact-token training records (one per answered model call)
"""

from .rewards import decision_rewards, event_rewards, outcome_reward
from .schema import MIGRATIONS, SCHEMA_VERSION
from .sft import SftWriter, safe_name, sft_filename, sft_records, sft_records_from_trace, write_jsonl_atomic
from .store import TraceStore
from .trace import (
    COMPACT,
    FULL,
    STRUCTURED,
    TRACE_FORMATS,
    build_compact_trace,
    build_session_trace,
    build_trace_payload,
)

__all__ = [
    "COMPACT",
    "FULL",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "STRUCTURED",
    "TRACE_FORMATS",
    "SftWriter",
    "TraceStore",
    "build_compact_trace",
    "build_session_trace",
    "build_trace_payload",
    "decision_rewards",
    "event_rewards",
    "outcome_reward",
    "safe_name",
    "sft_filename",
    "sft_records",
    "sft_records_from_trace",
    "write_jsonl_atomic",
]
