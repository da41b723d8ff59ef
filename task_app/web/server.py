"""`create_app(settings)`: the FastAPI app, its routers and middleware, and its lifespan (shared resources)."""

from __future__ import annotations

import functools
import gc
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import anyio
from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.gzip import GZipMiddleware

from ..core.offload import limited_offload
from ..core.outbound import open_session
from ..core.rubrics import load_rubrics
from ..core.settings import Settings
from ..core.version import app_version
from ..game import WorldFactory, warm_up
from ..rollout.fleet import FleetRuns, RunLimits, new_instance
from ..rollout.registry import RunRegistry
from ..service.callbacks import Callbacks
from ..service.metrics import Metrics, Sources
from ..service.policies import PolicyFactoryBuilder
from ..service.rollouts import RolloutService
from ..service.run_log import rollout_lines
from ..service.submissions import Handover, Submissions
from ..service.taskset import Taskset, TraitsCache
from ..sessions.runtime import open_sessions
from ..tracing.recording import TraceRecorder
from .handlers import install_error_handlers
from .limits import BodySizeLimit
from .loop_lag import LoopLagProbe
from .mcp_server import install as install_mcp
from .openapi import PROTECTED, errors
from .redaction import tokens_kept_out_of_server_logs
from .responses import JSONBytes
from .routes import envs, health, info, openenv, proxy, rollout, runs, submit, view
from .routes import metrics as metrics_route
from .state import AppState
from .step_fast_path import StepFastPath
from .task_count import TaskCount, counted_tasks

logger = logging.getLogger(__name__)


# While serving, the young generation is collected after this many net allocations (CPython: 700)
# and the middle one after this many young collections (CPython: 10); the oldest keeps its default.
_YOUNG_GC_THRESHOLD, _MIDDLE_GC_THRESHOLD = 20_000, 50


@contextmanager
def _collector_tuned() -> Iterator[None]:
    """While the app serves: every object alive after start-up (modules, numba's compiled kernels:
    ~170k objects) out of the cyclic GC's reach, and the young generation collected far less often;
    both undone at shutdown.

    A full collection otherwise walks the start-up objects with the GIL held, a stall of every rollout
    in flight. With a thousand rollouts in flight, collections every 700 allocations traverse their
    survivors over and over. Not too far apart either: a young collection walks whatever the young
    objects point to, and at a thousand rollouts one every 50,000 allocations stalled the loop past
    its lag bound; every 20,000 they stay within it, with the middle generation's period in
    allocations kept (20,000 x 50). The figures: docs/decisions/gc-freeze.md.
    """
    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(_YOUNG_GC_THRESHOLD, _MIDDLE_GC_THRESHOLD, thresholds[2])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    with counted_tasks() as tasks:
        async with _serving(app, settings, tasks):
            yield


@asynccontextmanager
async def _serving(app: FastAPI, settings: Settings, tasks: TaskCount) -> AsyncIterator[None]:
    rubrics = load_rubrics(settings.rubrics_dir)
    limiter = anyio.CapacityLimiter(settings.worker_threads)
    offload = limited_offload(limiter)
    worlds = WorldFactory(cache_size=settings.world_cache_size)
    if settings.warm_up:
        await offload(functools.partial(warm_up, worlds))
    async with (
        open_session(settings.outbound_max_connections, rollout_cap=settings.max_concurrent_rollouts) as http,
        open_sessions(settings, worlds, offload) as sessions,
    ):
        recorder = TraceRecorder(settings, offload)
        await recorder.start()
        loop_lag: LoopLagProbe | None = None
        try:
            fleet = FleetRuns(sessions.store, new_instance(), RunLimits.from_settings(settings))
            registry = RunRegistry(
                fleet,
                settings.max_concurrent_rollouts,
                max_queued=settings.max_queued_rollouts,
                keep_finished=settings.run_registry_size,
                keep_bytes=settings.runs_result_bytes,
            )
            metrics = Metrics(Sources(fleet.instance, registry, worlds, recorder, sessions))
            if settings.loop_lag_probe_s > 0:
                loop_lag = LoopLagProbe(settings.loop_lag_probe_s, metrics.registry)
                loop_lag.start()
            policies = PolicyFactoryBuilder(settings, http)
            service = RolloutService(
                settings, worlds, registry, policies.build, recorder, offload, metrics, rubrics, sessions.envs
            )
            submissions = Submissions(service, Callbacks(http, settings), metrics, app.state.handover)
            app.state.task_app = AppState(
                settings=settings,
                http=http,
                worlds=worlds,
                traits=TraitsCache(worlds, settings.traits_cache_size),
                taskset=Taskset(settings, rubrics),
                rubrics=rubrics,
                registry=registry,
                recorder=recorder,
                service=service,
                submissions=submissions,
                metrics=metrics,
                offload=offload,
                sessions=sessions,
                loop_lag=loop_lag,
                tasks=tasks,
            )
            logger.info("task app ready: %s", settings.service_id)
            async with anyio.create_task_group() as watch:
                watch.start_soon(registry.watch, settings.runs_heartbeat_s, settings.runs_abort_poll_s)
                with _collector_tuned(), tokens_kept_out_of_server_logs(), rollout_lines(settings.rollout_log):
                    async with submissions.running():
                        yield
                watch.cancel_scope.cancel()
        finally:
            if loop_lag is not None:
                await loop_lag.close()
            await recorder.close()


def create_app(settings: Settings, handover: Handover | None = None) -> FastAPI:
    """The app; `handover`: how accepted asynchronous runs are run elsewhere (modal_app.py spawns them),
    None to run them in this process."""
    app = FastAPI(
        title="Crafter task app",
        version=app_version(),
        lifespan=_lifespan,
        default_response_class=JSONBytes,
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.handover = handover
    for router in (
        health.router,
        info.router,
        proxy.router,
        rollout.router,
        runs.router,
        submit.router,
        envs.root,
        envs.hosted,
    ):
        app.include_router(router)
    openenv.install(app)
    install_mcp(app)  # MCP for agents at /mcp (mcp_server.py)
    # The viewer's HTML route and the metrics' text, with their JSON errors declared for the OpenAPI schema.
    app.include_router(view.router, responses=errors(*PROTECTED, 404, 409, 422, non_json=True))
    app.include_router(metrics_route.router, responses=errors(*PROTECTED, non_json=True))
    install_error_handlers(app)
    if settings.step_fast_path:
        app.add_middleware(StepFastPath)  # innermost: the size limit and compression apply to it
    # zlib's default level, not Starlette's 9, and small bodies as they are: docs/decisions/compression.md.
    app.add_middleware(GZipMiddleware, minimum_size=settings.gzip_min_bytes, compresslevel=6)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["*"], allow_headers=["*"]
        )
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    return app


@functools.cache
def _settings_from_env() -> Settings:
    return Settings()


def app_from_env() -> FastAPI:
    """Factory for `uvicorn --factory task_app.web.server:app_from_env`: what `task-app serve --reload` and
    each process of `--processes N` build, from the environment."""
    return create_app(_settings_from_env())


APP_FROM_ENV = f"{__name__}:{app_from_env.__name__}"
