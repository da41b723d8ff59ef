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
from ..game import WorldFactory, warm_up
from ..rollout.registry import RunRegistry
from ..service.policies import PolicyFactoryBuilder
from ..service.rollouts import RolloutService
from ..service.taskset import Taskset, TraitsCache
from ..sessions.runtime import open_sessions
from ..tracing.recording import TraceRecorder
from .handlers import install_error_handlers
from .limits import BodySizeLimit
from .loop_lag import LoopLagProbe
from .openapi import PROTECTED, errors
from .redaction import tokens_kept_out_of_server_logs
from .responses import JSONBytes
from .routes import envs, health, info, openenv, proxy, rollout, runs, view
from .state import AppState

logger = logging.getLogger(__name__)


# While serving, the young generation is collected after this many net allocations (CPython: 700)
# and the middle one after this many young collections (CPython: 10); the oldest keeps its default.
_YOUNG_GC_THRESHOLD, _MIDDLE_GC_THRESHOLD = 50_000, 20


@contextmanager
def _collector_tuned() -> Iterator[None]:
    """While the app serves: every object alive after start-up (modules, numba's compiled kernels:
    ~170k objects) out of the cyclic GC's reach, and the young generation collected far less often;
    both undone at shutdown.

    A full collection otherwise walks the start-up objects with the GIL held, a stall of every rollout
    in flight (benchmarks/ B3 at 64 x 200 ms: loop lag max 200 -> 30 ms, share of the ideal 89 ->
    91 %). With a thousand rollouts in flight, collections every 700 allocations traverse their
    survivors over and over (B8, 1024 x 2 s: server CPU per decision 3.0 -> 2.4-2.7 ms, share of the
    ideal 54 % -> 60-69 %, on a loaded machine).
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
    rubrics = load_rubrics(settings.rubrics_dir)
    limiter = anyio.CapacityLimiter(settings.worker_threads)
    offload = limited_offload(limiter)
    worlds = WorldFactory(cache_size=settings.world_cache_size)
    if settings.warm_up:
        await offload(functools.partial(warm_up, worlds))
    loop_lag = LoopLagProbe(settings.loop_lag_probe_s) if settings.loop_lag_probe_s > 0 else None
    async with (
        open_session(settings.inference_max_connections) as http,
        open_sessions(settings, worlds, offload) as sessions,
    ):
        recorder = TraceRecorder(settings, offload)
        await recorder.start()
        if loop_lag is not None:
            loop_lag.start()
        try:
            registry = RunRegistry(settings.max_concurrent_rollouts, settings.run_registry_size)
            policies = PolicyFactoryBuilder(settings, http)
            service = RolloutService(settings, worlds, registry, policies.build, recorder, offload, rubrics)
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
                offload=offload,
                sessions=sessions,
                loop_lag=loop_lag,
            )
            logger.info("task app ready: %s", settings.service_id)
            with _collector_tuned(), tokens_kept_out_of_server_logs():
                yield
        finally:
            if loop_lag is not None:
                await loop_lag.close()
            await recorder.close()


def create_app(settings: Settings) -> FastAPI:
    app = FastAPI(
        title="Crafter task app",
        version="1.0.0",
        lifespan=_lifespan,
        default_response_class=JSONBytes,
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    for router in (health.router, info.router, proxy.router, rollout.router, runs.router, envs.root, envs.hosted):
        app.include_router(router)
    openenv.install(app)
    # The viewer's HTML route, with its JSON errors declared for the OpenAPI schema.
    app.include_router(view.router, responses=errors(*PROTECTED, 404, 409, 422, html_route=True))
    install_error_handlers(app)
    app.add_middleware(GZipMiddleware, minimum_size=1024)
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
    """Factory for `uvicorn --factory task_app.web.server:app_from_env` (used by `task-app serve --reload`)."""
    return create_app(_settings_from_env())
