"""Run state: admission (the per-process cap), the runs this process holds, and the fleet's record of all runs.

    POST /rollout  ─► admit: 409 if held here ─► 429 at the cap ─► registered (listed in heartbeats) ─► the
                      run_id claimed in the store (fleet.py): taken and running → 409 `run_in_progress`;
                      ended → its stored response, byte for byte, or 409 `run_id_used` once that is gone;
                      lost → a new attempt, run here
    POST /rollouts ─► accept: the same claim; the run queued here for a slot, or handed over (`request`)
    finish         ─► the response and the end record into the store, then the run leaves this process

Budgets: the responses this process stored stay within `keep_bytes` (oldest deleted first; the run_id is
still remembered, so 409 `run_id_used`), and its `keep_finished` latest finished runs are remembered at
all (beyond that their records are deleted and the run_id is free again). The store's TTLs bound the
rest, e.g. what a process that died left behind.

`watch` (run by the lifespan) writes this process's heartbeat every `heartbeat_s` while it holds runs,
and polls its bell every `poll_s` for aborts asked for on other processes. Only the event loop touches
the registry.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import anyio

from ..core.errors import CapacityExceeded, Conflict, Gone, NotFound, RateLimited, StoreUnavailable
from ..core.lru import LruMap
from .control import RunControl, RunStatus
from .fleet import FleetRuns, RunView

logger = logging.getLogger(__name__)


def in_progress(run_id: str) -> Conflict:
    return Conflict(f"run {run_id!r} is still running", code="run_in_progress", run_id=run_id)


def not_found(run_id: str) -> NotFound:
    return NotFound(f"run {run_id!r} not found", code="run_not_found", run_id=run_id)


def _final(message: str, code: str, run_id: str) -> Conflict:
    """A 409 that the same request cannot get past (`retryable: false`, `x-should-retry: false`)."""
    return Conflict(message, code=code, run_id=run_id, headers={"x-should-retry": "false"})


def run_id_used(run_id: str) -> Conflict:
    return _final(
        f"run {run_id!r} already ran and its response is no longer kept; use a new run_id", "run_id_used", run_id
    )


def lost(run_id: str) -> Conflict:
    return _final(f"run {run_id!r} was lost with its process; submit it again", "run_lost", run_id)


def result_expired(run_id: str) -> Gone:
    return Gone(f"the response of run {run_id!r} is no longer kept", code="result_expired", run_id=run_id)


@dataclass(slots=True)
class RunEntry:
    """A run this process holds (queued for a slot or running)."""

    run_id: str
    started_at: float
    attempt: int = 0
    status: RunStatus = RunStatus.RUNNING
    control: RunControl = field(default_factory=RunControl)
    finished_at: float | None = None
    slot: bool = False

    def at_attempt(self, attempt: int) -> None:
        self.attempt = attempt

    def view(self) -> RunView:
        progress = dict(self.control.progress)
        return RunView(self.run_id, self.attempt, self.status, self.started_at, self.finished_at, progress)


@dataclass(slots=True)
class Acceptance:
    """What POST /rollouts did with one run: took it (`entry` when it runs here) or found it taken."""

    view: RunView
    accepted: bool
    entry: RunEntry | None = None


class RunRegistry:
    def __init__(
        self,
        fleet: FleetRuns,
        max_active: int,
        *,
        max_queued: int = 4096,
        keep_finished: int = 4096,
        keep_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.fleet = fleet
        self.max_active = max_active
        self.max_queued = max_queued
        self._slots = anyio.Semaphore(max_active)
        self._entries: dict[str, RunEntry] = {}
        # (run_id, attempt) -> (parts, bytes) of its stored response, and -> parts of every finished run
        self._results: LruMap[tuple[str, int], tuple[int, int]] = LruMap(
            keep_finished, max_weight=keep_bytes, weight=lambda stored: stored[1]
        )
        self._remembered: LruMap[tuple[str, int], int] = LruMap(keep_finished)
        self._listed = False  # the last heartbeat listed runs
        self.store_failures = 0

    @property
    def active(self) -> int:
        return self.max_active - int(self._slots.value)

    @property
    def queued(self) -> int:
        return sum(1 for entry in self._entries.values() if entry.status is RunStatus.QUEUED)

    def held(self, run_id: str) -> RunEntry | None:
        return self._entries.get(run_id)

    # --- taking a run_id --------------------------------------------------------------------------

    async def admit(self, run_id: str) -> RunEntry | bytes:
        """A slot and the run_id for a rollout run here now, or the stored response of one that ended.
        Raises 409 (`run_in_progress`, `run_id_used`) and 429 (`capacity_exceeded`)."""
        if run_id in self._entries:
            raise in_progress(run_id)
        try:
            self._slots.acquire_nowait()
        except anyio.WouldBlock:
            raise CapacityExceeded(self.active, self.max_active) from None
        entry = self._register(run_id, RunStatus.RUNNING)
        entry.slot = True
        try:
            _, taken = await self.fleet.claim(run_id, self.fleet.instance, trying=entry.at_attempt)
        except BaseException:
            self._drop(entry)
            raise
        if taken is None:
            return entry
        self._drop(entry)
        if not taken.status.finished:
            raise in_progress(run_id)
        response = await self.fleet.response(taken)
        if response is None:
            raise run_id_used(run_id)
        return response

    async def accept(self, run_id: str, request: bytes | None = None) -> Acceptance:
        """Take the run_id for an asynchronous run: queued here (`request` None), or handed over to run
        elsewhere (the request is stored for that process). A run_id already taken is reported as it is."""
        held = self._entries.get(run_id)
        if held is not None:
            return Acceptance(held.view(), accepted=False)
        entry = None
        if request is None:
            if self.queued >= self.max_queued:
                raise RateLimited(
                    f"{self.max_queued} accepted rollouts are waiting on this process; retry later",
                    code="queue_full",
                    limit=self.max_queued,
                )
            entry = self._register(run_id, RunStatus.QUEUED)
        owner = self.fleet.instance if entry is not None else None
        trying = entry.at_attempt if entry is not None else (lambda attempt: None)
        try:
            attempt, taken = await self.fleet.claim(run_id, owner, request, trying)
        except BaseException:
            if entry is not None:
                self._drop(entry)
            raise
        if taken is not None:
            if entry is not None:
                self._drop(entry)
            return Acceptance(taken, accepted=False)
        if entry is not None:
            return Acceptance(entry.view(), accepted=True, entry=entry)
        return Acceptance(RunView(run_id, attempt, RunStatus.QUEUED, self.fleet.now()), accepted=True)

    async def take_over(self, run_id: str, attempt: int) -> RunEntry | None:
        """The executor's side of a handed-over run: the run registered here, or None when another
        process started it (the platform delivered the work twice) or it is held here already."""
        if run_id in self._entries:
            return None
        entry = self._register(run_id, RunStatus.QUEUED)
        entry.attempt = attempt
        try:
            won = await self.fleet.start(run_id, attempt)
            if won and (await self.fleet.aborted([(run_id, attempt)]))[0]:
                entry.control.abort()
        except BaseException:
            self._drop(entry)
            raise
        if not won:
            self._drop(entry)
            return None
        return entry

    async def take_slot(self, entry: RunEntry) -> None:
        """Wait for one of the process's rollout slots (a queued run)."""
        await self._slots.acquire()
        entry.slot, entry.status = True, RunStatus.RUNNING

    def _register(self, run_id: str, status: RunStatus) -> RunEntry:
        entry = RunEntry(run_id, self.fleet.now(), status=status)
        self._entries[run_id] = entry
        return entry

    def _drop(self, entry: RunEntry) -> None:
        if self._entries.get(entry.run_id) is entry:
            del self._entries[entry.run_id]
        if entry.slot:
            entry.slot = False
            self._slots.release()

    # --- ending -----------------------------------------------------------------------------------

    async def finish(
        self, entry: RunEntry, status: RunStatus, response: bytes | None, error: dict[str, Any] | None = None
    ) -> None:
        """Record the end (the response first; `error` for a run that produced none) in the store, then
        release the run. A store failure is logged, not raised: the caller still answers with what ran."""
        entry.status, entry.finished_at = status, self.fleet.now()
        try:
            with anyio.CancelScope(shield=True):
                parts = await self.fleet.finish(entry.view(), response, error)
        except StoreUnavailable as exc:
            self.store_failures += 1
            logger.warning("the end of run %s was not stored: %s", entry.run_id, exc.message)
            return
        finally:
            self._drop(entry)
        await self._keep((entry.run_id, entry.attempt), parts, len(response or b""))

    async def _keep(self, key: tuple[str, int], parts: int, size: int) -> None:
        """The budgets: drop the oldest stored responses, and forget the oldest finished runs."""
        forget = self._remembered.put(key, parts)
        expired = self._results.put(key, (parts, size)) if parts else []
        try:
            for old, old_parts in forget:
                self._results.pop(old)
                await self.fleet.forget(old[0], old[1], old_parts)
            for old, (old_parts, _) in expired:
                await self.fleet.forget_response(old[0], old[1], old_parts)
        except StoreUnavailable as exc:
            logger.warning("old runs were not deleted from the state store: %s", exc.message)

    # --- reading and aborting ---------------------------------------------------------------------

    async def status(self, run_id: str) -> RunView:
        entry = self._entries.get(run_id)
        if entry is not None:
            return entry.view()
        view = await self.fleet.view(run_id)
        if view is None:
            raise not_found(run_id)
        return view

    async def result(self, run_id: str) -> tuple[RunView, bytes | None]:
        """The run's status and, once it ended, its response (410 once that is gone, 409 when lost)."""
        view = await self.status(run_id)
        if view.status is RunStatus.LOST:
            raise lost(run_id)
        if not view.status.finished:
            return view, None
        response = await self.fleet.response(view)
        if response is not None:
            return view, response
        if view.reusable:  # it ended without producing a response
            error = (view.end or {}).get("error") or {}
            message = error.get("message") or "it ended without a response"
            raise _final(f"run {run_id!r} failed: {message}; submit it again", "run_failed", run_id)
        raise result_expired(run_id)

    async def abort(self, run_id: str) -> RunView:
        """Abort the run wherever it runs (idempotent; a finished run is returned as it is)."""
        entry = self._entries.get(run_id)
        if entry is not None:
            entry.control.abort()
            return entry.view()
        view = await self.status(run_id)
        if view.status in (RunStatus.QUEUED, RunStatus.RUNNING):
            await self.fleet.request_abort(view)
        return view

    # --- the heartbeat and the bell ---------------------------------------------------------------

    async def watch(self, heartbeat_s: float, poll_s: float) -> None:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._beat_forever, heartbeat_s)
            tasks.start_soon(self._poll_forever, poll_s)

    async def beat(self) -> None:
        at = self.fleet.now()  # before the runs are listed: a beat later than a claim lists its run
        runs: dict[str, list[Any]] = {
            run_id: [entry.attempt, entry.status.value, entry.control.progress]
            for run_id, entry in self._entries.items()
        }
        if runs or self._listed:
            await self.fleet.beat(at, runs)
        self._listed = bool(runs)

    async def poll_aborts(self) -> None:
        if not self._entries or not await self.fleet.bell_rang():
            return
        entries = list(self._entries.values())
        flags = await self.fleet.aborted([(entry.run_id, entry.attempt) for entry in entries])
        for entry, flagged in zip(entries, flags, strict=True):
            if flagged:
                entry.control.abort()

    async def _beat_forever(self, interval_s: float) -> None:
        while True:
            try:
                await self.beat()
            except StoreUnavailable as exc:
                logger.warning("heartbeat not written: %s", exc.message)
            await anyio.sleep(interval_s)

    async def _poll_forever(self, interval_s: float) -> None:
        while True:
            await anyio.sleep(interval_s)
            try:
                await self.poll_aborts()
            except StoreUnavailable as exc:
                logger.warning("abort poll failed: %s", exc.message)
