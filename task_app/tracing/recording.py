"""Everything that happens to a finished rollout's data: the trace payload, the store, SFT files.

The store write is awaited (committed) before the response goes out; storage trouble never fails
the rollout: it is reported in `metrics.details.storage` and in `/health`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio

from ..core.offload import Offload
from ..core.settings import Settings
from ..rollout.result import DecisionRecord, RolloutResult
from .rows import SessionRows, SessionRowsBuilder, session_rows
from .sft import SftWriter
from .store import TraceStore
from .trace import STRUCTURED, build_session_trace, build_trace_payload, session_header, structured_step

logger = logging.getLogger(__name__)


class RolloutRows:
    """The stored trace of one rollout, turned into rows a decision at a time as the engine records it
    (`add` is its `on_record`), so the end of a rollout only adds the session row and commits.

    `add` runs on the event loop (~0.3 ms of CPU a decision: B1's loop thread, tracing on against
    off): spread over the rollout, the work no longer
    piles up when a batch of rollouts ends together (benchmarks/ B3). A bug here never fails the
    rollout: the rows are dropped, logged, and `finalise` builds the trace from the result instead
    (reporting any failure in the response metadata).
    """

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._builder: SessionRowsBuilder | None = SessionRowsBuilder(run_id)

    def add(self, result: RolloutResult, record: DecisionRecord) -> None:
        if self._builder is None:
            return
        try:
            self._builder.add_step(structured_step(result, record))
        except Exception:  # noqa: BLE001 - never fails the rollout; logged, and finalise rebuilds the trace
            self._drop()

    def rows(self, result: RolloutResult) -> SessionRows | None:
        if self._builder is None or len(result.records) != self._builder.steps:
            return None
        try:
            return self._builder.finish(session_header(result))
        except Exception:  # noqa: BLE001 - as in add
            self._drop()
            return None

    def _drop(self) -> None:
        logger.warning("trace rows failed; rebuilding them at the end", exc_info=True, extra={"run_id": self.run_id})
        self._builder = None


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
        """Rows to fill while the rollout runs (None when nothing is stored)."""
        return RolloutRows(run_id) if self.store is not None else None

    async def finalise(self, result: RolloutResult, rows: RolloutRows | None = None) -> dict[str, Any] | None:
        """Persist the rollout (shielded from cancellation) and return the trace payload it asked for."""
        plan = result.plan
        trace = None
        if plan.return_trace:
            trace = await self.offload(lambda: build_trace_payload(result, plan.trace_format))
        storage: dict[str, Any] = {}
        with anyio.CancelScope(shield=True):
            if self.store is not None:
                built = rows.rows(result) if rows is not None else None
                stored_trace = trace if plan.return_trace and plan.trace_format == STRUCTURED else None
                storage["trace"] = await self.store.write(plan.run_id, built or _rows_builder(result, stored_trace))
            if self.sft is not None:
                storage["sft"] = await self.sft.write(result)
        result.storage = storage or None
        return trace


def _rows_builder(result: RolloutResult, trace: dict[str, Any] | None) -> Callable[[], SessionRows]:
    """Rows from the structured trace the response already carries, or from the result."""
    return lambda: session_rows(trace if trace is not None else build_session_trace(result, STRUCTURED))
