"""Asynchronous submission: `POST /rollouts` takes one rollout or a group and answers at once (202); each
run's status and response are then read from any process (`GET /runs/{run_id}`, `.../result`).

    submit ─► every request validated, callback URLs checked (422 before anything is claimed)
           ─► per run: the run_id claimed (registry.accept; one taken already is reported as it is)
           ─► run here: queued for one of the process's slots, in the lifespan's task group
              or handed over (`Handover`): on Modal a spawned call of a method of the app class, which
              Modal counts as an input, so the container is not scaled down under it (modal_app.py)
    a run  ─► a slot ─► RolloutService.execute (the end and the response stored) ─► the callback, if any

A group is several rollouts, typically of one seed (GRPO): their world is generated once per process
(`WorldFactory` makes concurrent requests for one seed wait for one generation) and restored after that.
At shutdown the runs of this process are aborted and end with what ran (`GRACE_S`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager

import anyio
import anyio.abc
from pydantic import ValidationError

from ..core.contracts import AsyncRolloutRequest
from ..core.errors import InvalidRequest, NotConfigured, TaskAppError
from ..core.json_codec import dumps_bytes
from ..rollout.control import RunStatus
from ..rollout.fleet import RunView
from ..rollout.plan import RolloutPlan, check_outbound_url
from ..rollout.registry import Acceptance, RunEntry, RunRegistry
from .callbacks import Callbacks
from .metrics import Metrics
from .rollouts import RolloutService

logger = logging.getLogger(__name__)

Handover = Callable[[str, int], Awaitable[None]]  # (run_id, attempt): run it on some process, soon
GRACE_S = 20.0


class Submissions:
    def __init__(
        self,
        rollouts: RolloutService,
        callbacks: Callbacks,
        metrics: Metrics,
        handover: Handover | None = None,
    ) -> None:
        self.rollouts = rollouts
        self.registry: RunRegistry = rollouts.registry
        self.callbacks = callbacks
        self.metrics = metrics
        self.handover = handover
        self._tasks: anyio.abc.TaskGroup | None = None
        self._here: dict[str, RunEntry] = {}  # runs of this process's background, by run_id

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The task group of the runs started here; at exit they are aborted and given `GRACE_S` to end."""
        async with anyio.create_task_group() as tasks:
            self._tasks = tasks
            try:
                yield
            finally:
                self._tasks = None
                for entry in self._here.values():
                    entry.control.abort()
                tasks.cancel_scope.deadline = anyio.current_time() + GRACE_S

    # --- accepting ----------------------------------------------------------------------------

    async def submit(self, requests: Sequence[AsyncRolloutRequest]) -> list[Acceptance]:
        settings = self.rollouts.settings
        if not requests:
            raise InvalidRequest("the list of rollouts is empty", code="empty_batch")
        if len(requests) > settings.max_batch_rollouts:
            raise InvalidRequest(
                f"at most {settings.max_batch_rollouts} rollouts per call (TASKAPP_MAX_BATCH_ROLLOUTS)",
                code="too_many_rollouts",
            )
        seen: set[str] = set()
        for request in requests:
            if request.run_id in seen:
                raise InvalidRequest(f"run_id {request.run_id!r} is in the list twice", code="duplicate_run_id")
            seen.add(request.run_id)
        plans = [self.rollouts.plan(request) for request in requests]
        for request in requests:
            if request.callback_url is not None:
                check_outbound_url(
                    request.callback_url, settings.inference_allowed_hosts, field="callback_url", kind="callback"
                )
        if self._tasks is None:
            raise NotConfigured("the app is shutting down", code="shutting_down")
        return [await self._accept(request, plan) for request, plan in zip(requests, plans, strict=True)]

    async def _accept(self, request: AsyncRolloutRequest, plan: RolloutPlan) -> Acceptance:
        stored = dumps_bytes(request.model_dump(mode="json")) if self.handover is not None else None
        acceptance = await self.registry.accept(plan.run_id, stored)
        if not acceptance.accepted:
            return acceptance
        if acceptance.entry is not None:
            self._start(acceptance.entry, plan, request.callback_url)
        else:
            await self._hand_over(acceptance.view)
        return acceptance

    async def _hand_over(self, view: RunView) -> None:
        if self.handover is None:  # pragma: no cover - accept() stores a request only with a handover
            raise RuntimeError("no handover")
        try:
            await self.handover(view.run_id, view.attempt)
            await self.registry.fleet.mark_queued(view.run_id, view.attempt)
        except Exception as exc:  # noqa: BLE001 - any failure of the platform's call: the run ends failed
            logger.warning("run %s could not be handed over: %s: %s", view.run_id, type(exc).__name__, exc)
            view.status, view.finished_at = RunStatus.FAILED, self.registry.fleet.now()
            error = {"code": "handover_failed", "message": f"the run could not be handed over ({type(exc).__name__})"}
            with anyio.CancelScope(shield=True):
                await self.registry.fleet.finish(view, None, error)

    def _start(self, entry: RunEntry, plan: RolloutPlan, callback_url: str | None) -> None:
        if self._tasks is None:  # pragma: no cover - submit() checked it
            raise RuntimeError("not running")
        self._here[entry.run_id] = entry
        self._tasks.start_soon(self._run, entry, plan, callback_url, name=f"run {plan.run_id}")

    # --- running ------------------------------------------------------------------------------

    async def run_handed_over(self, run_id: str, attempt: int) -> None:
        """The executor's side of a handover (on Modal: the body of the spawned method call): run it here
        to its end, unless another process has it already."""
        entry = await self.registry.take_over(run_id, attempt)
        if entry is None:
            logger.info("run %s attempt %d is run elsewhere; not again here", run_id, attempt)
            return
        raw = await self.registry.fleet.request(run_id, attempt)
        try:
            if raw is None:
                raise NotConfigured("the request is no longer in the state store", code="request_missing")
            request = AsyncRolloutRequest.model_validate_json(raw)
            plan = self.rollouts.plan(request)
        except (TaskAppError, ValidationError) as exc:
            message = exc.message if isinstance(exc, TaskAppError) else "the stored request is not valid"
            await self.registry.finish(entry, RunStatus.FAILED, None, {"code": "request_unusable", "message": message})
            return
        self._here[entry.run_id] = entry
        await self._run(entry, plan, request.callback_url)

    async def _run(self, entry: RunEntry, plan: RolloutPlan, callback_url: str | None) -> None:
        try:
            try:
                await self.registry.take_slot(entry)
            except BaseException:  # cancelled while it waited (shutdown): it ends without having run
                with anyio.CancelScope(shield=True):
                    await self.registry.finish(entry, RunStatus.FAILED, None)
                raise
            try:
                body = await self.rollouts.execute(plan, entry)
            except TaskAppError as exc:  # recorded with the run's end (GET /runs/{run_id} says why)
                logger.warning("run %s failed: %s", plan.run_id, exc.message)
                return
            except Exception:  # a bug ends this run (its end is recorded), never the others: logged
                logger.error("run %s failed", plan.run_id, exc_info=True)
                return
        finally:
            self._here.pop(entry.run_id, None)
        if callback_url is not None:
            outcome = await self.callbacks.deliver(callback_url, plan.run_id, body)
            self.metrics.callbacks.labels("delivered" if outcome["delivered"] else "failed").inc()
            try:
                await self.registry.fleet.record_callback(plan.run_id, entry.attempt, outcome)
            except TaskAppError as exc:
                logger.warning("the callback outcome of run %s was not stored: %s", plan.run_id, exc.message)
