"""Traces and training data: v3 trace payloads, the durable SQLite store, SFT JSONL files.

trace.py        RolloutResult -> compact | structured | full payloads (pure)
calls.py        LMCall -> tracing_v3 LLMCallRecord; message/content helpers
reward_rows.py  the rewards a trace records: achievement deltas, event rewards, the outcome
compact.py      repeated prompt texts stored once per session
rows.py         RolloutResult -> rows of the trace tables (named row types, one builder)
schema.py       DDL, PRAGMA user_version migrations
writer.py       TraceWriter: a connection in a thread of its own, one transaction per queued batch
reader.py       TraceReader: read-only queries, rows back to a SessionTrace dict
store.py        TraceStore: a writer and a reader over one file (the server's)
recording.py    what a finished (or running) rollout leaves behind: payload, stored rows, SFT file
sft.py          SFT records and the atomic per-run JSONL writer
token_records.py  exact-token training records (one per answered model call)
"""

from .reader import TraceReader
from .reward_rows import decision_rewards, event_rewards, outcome_reward
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
    "TraceReader",
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
