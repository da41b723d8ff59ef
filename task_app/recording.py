"""Everything that happens to a finished rollout's data: the trace payload, the store, SFT files.

The store write is awaited (committed) before the response goes out; storage trouble never fails
the rollout: it is reported in `metrics.details.storage` and in `/health`.
"""

from __future__ import annotations

from typing import Any

import anyio

from .rollout.engine import Offload
from .rollout.result import RolloutResult
from .settings import Settings
from .tracing import STRUCTURED, SftWriter, TraceStore, build_trace_payload


class TraceRecorder:
    def __init__(self, settings: Settings, offload: Offload[Any]) -> None:
        self.offload = offload
        self.store = TraceStore(settings.traces_db, settings.trace_queue_size) if settings.tracing_enabled else None
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

    async def finalise(self, result: RolloutResult) -> dict[str, Any] | None:
        """Persist the rollout (shielded from cancellation) and return the trace payload it asked for."""
        plan = result.plan
        trace = None
        if plan.return_trace:
            trace = await self.offload(lambda: build_trace_payload(result, plan.trace_format))
        storage: dict[str, Any] = {}
        with anyio.CancelScope(shield=True):
            if self.store is not None:
                stored_trace = trace if plan.return_trace and plan.trace_format == STRUCTURED else None
                storage["trace"] = await self.store.write(result, stored_trace)
            if self.sft is not None:
                storage["sft"] = await self.sft.write(result)
        result.storage = storage or None
        return trace
