"""Everything that happens to a finished rollout's data: the trace payload, the store, SFT files.

The store write is awaited (committed) before the response goes out; storage trouble never fails
the rollout: it is reported in `metrics.details.storage` and in `/health`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import anyio

from ..core.offload import Offload
from ..core.settings import Settings
from ..rollout.result import DecisionRecord, RolloutResult
from .rows import SessionRows, SessionRowsBuilder, session_rows
from .sft import SftWriter
from .store import TraceStore
from .trace import STRUCTURED, build_session_trace, build_trace_payload, session_header

logger = logging.getLogger(__name__)

# How often a running rollout's new rows go to the store. Each flush is one small job, grouped with
# other rollouts' by the writer; at fast models a flush carries a few decisions, and a rollout
# shorter than this writes everything at its end (docs/decisions/trace-writer.md).
FLUSH_INTERVAL_S = 0.5


class RolloutRows:
    """The stored trace of one rollout, written while it runs: `add` (the engine's `on_record`) notes
    each decision, and every `flush_interval_s` the rows of the decisions noted since are built and go
    to the store's queue without waiting, so the end of a rollout only builds and commits its last
    rows and the session row, queued behind its parts rather than after they committed.

    The rows are built on the event loop, a flush's decisions in one run rather than each as it is
    recorded: between two decisions everything else the process does pushes the builder's code and
    data out of the CPU's caches. Writing them during the rollout spends its model calls' idle time on
    SQLite, where before every rollout of a batch that ended together waited behind every other one's
    rows (docs/decisions/trace-writer.md has the figures). A bug here never fails the rollout: the rows
    are dropped, logged, and `commit` stores the trace built from the result instead (replacing any
    part written), as it does when a part failed to store.
    """

    def __init__(
        self, run_id: str, store: TraceStore | None = None, flush_interval_s: float = FLUSH_INTERVAL_S
    ) -> None:
        self.run_id = run_id
        self._builder: SessionRowsBuilder | None = SessionRowsBuilder(run_id)
        self._pending: list[DecisionRecord] = []  # recorded, rows not built yet
        self._store = store
        self._flush_interval_s = flush_interval_s
        self._flushed_at = time.monotonic()
        self._appended = False  # a part went to the store: the end adds to it

    def add(self, result: RolloutResult, record: DecisionRecord) -> None:
        if self._builder is None:
            return
        self._pending.append(record)
        if self._store is not None and time.monotonic() - self._flushed_at >= self._flush_interval_s:
            self._flush(self._store, result)

    def _built(self, result: RolloutResult) -> SessionRowsBuilder | None:
        """The builder with every pending decision's rows added (None once rows failed)."""
        builder = self._builder
        if builder is None or not self._pending:
            return builder
        try:
            for record in self._pending:
                builder.add_decision(result, record)
        except Exception:  # noqa: BLE001 - never fails the rollout; logged, and commit rebuilds the trace
            self._drop()
            return None
        self._pending.clear()
        return builder

    def _flush(self, store: TraceStore, result: RolloutResult) -> None:
        if not store.has_room:  # checked before `take`: the rows wait for the next flush or the end
            return
        builder = self._built(result)
        if builder is None:
            return
        if store.append(builder.take(), replace=not self._appended) is not None:  # has_room held: always
            self._appended = True
        self._flushed_at = time.monotonic()

    def rows(self, result: RolloutResult) -> SessionRows | None:
        """All of the rollout's rows, or None if they cannot be trusted (a failure, a missed record)."""
        builder = self._built(result)
        if builder is None or len(result.records) != builder.steps:
            return None
        try:
            return builder.finish(session_header(result))
        except Exception:  # noqa: BLE001 - as in add
            self._drop()
            return None

    async def commit(self, result: RolloutResult, rebuild: Callable[[], SessionRows]) -> dict[str, Any]:
        """Store the rest and the session row, added to the parts; anything wrong (a part or the rest
        not stored, rows that failed), the whole trace again, replacing the parts (`rebuild` when the
        rows failed). Returns the store's status."""
        store = self._store
        if store is None:
            raise RuntimeError("RolloutRows.commit needs the store it was made with")
        builder = self._built(result)
        if builder is None or len(result.records) != builder.steps:
            return await store.write(self.run_id, rebuild)
        if self._appended:
            try:
                rest = builder.take(session_header(result))
            except Exception:  # noqa: BLE001 - as in add
                self._drop()
                return await store.write(self.run_id, rebuild)
            status = await store.write(self.run_id, rest, replace=False)
            if status.get("stored"):
                return status
        return await store.write(self.run_id, self.rows(result) or rebuild)

    def discard(self) -> None:
        """The rollout will not be committed: remove the parts written (queued)."""
        if self._store is not None and self._appended:
            self._store.discard(self.run_id)
            self._appended = False

    def _drop(self) -> None:
        logger.warning("trace rows failed; rebuilding them at the end", exc_info=True, extra={"run_id": self.run_id})
        self._builder = None
        self._pending.clear()


class TraceRecorder:
    def __init__(self, settings: Settings, offload: Offload) -> None:
        self.offload = offload
        self.store = (
            TraceStore(settings.traces_db, settings.trace_queue_size, cache_mb=settings.traces_cache_mb)
            if settings.tracing_enabled
            else None
        )
        self.sft = SftWriter(settings.sft_output_dir) if settings.sft_output_dir else None

    async def start(self) -> None:
        if self.store is not None:
            await self.store.start()
        if self.sft is not None:
            await self.sft.start()

    async def close(self) -> None:
        if self.store is not None:
            await self.store.close()

    def health(self) -> dict[str, Any]:
        if self.store is None:
            return {"status": "disabled"}
        return self.store.health()

    def rollout_rows(self, run_id: str) -> RolloutRows | None:
        """Rows to fill, and write, while the rollout runs (None when nothing is stored)."""
        return RolloutRows(run_id, self.store) if self.store is not None else None

    async def finalise(self, result: RolloutResult, rows: RolloutRows | None = None) -> dict[str, Any] | None:
        """Persist the rollout (shielded from cancellation) and return the trace payload it asked for."""
        plan = result.plan
        trace = None
        if plan.return_trace:
            trace = await self.offload(lambda: build_trace_payload(result, plan.trace_format))
        storage: dict[str, Any] = {}
        with anyio.CancelScope(shield=True):
            if self.store is not None:
                stored_trace = trace if plan.return_trace and plan.trace_format == STRUCTURED else None
                rebuild = _rows_builder(result, stored_trace)
                storage["trace"] = await (
                    rows.commit(result, rebuild) if rows is not None else self.store.write(plan.run_id, rebuild)
                )
            if self.sft is not None:
                storage["sft"] = await self.sft.write(result)
        result.storage = storage or None
        return trace


def _rows_builder(result: RolloutResult, trace: dict[str, Any] | None) -> Callable[[], SessionRows]:
    """Rows from the structured trace the response already carries, or from the result."""
    return lambda: session_rows(trace if trace is not None else build_session_trace(result, STRUCTURED))
