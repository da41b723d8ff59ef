"""`create_app(settings)`: the FastAPI app, its lifespan (shared resources) and its error model."""

from __future__ import annotations

import functools
import gc
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

import anyio
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request

from .auth import check_api_key
from .crafter import WorldFactory
from .errors import CapacityExceeded, TaskAppError
from .limits import BodySizeLimit
from .loop_lag import LoopLagProbe
from .outbound import open_session
from .policy.factory import PolicyFactoryBuilder
from .recording import TraceRecorder
from .responses import JSONBytes
from .rollout.registry import RunRegistry
from .routes import health, info, proxy, rollout, runs, view
from .routes.openapi import PROTECTED, allowed_methods, errors
from .rubrics import load_rubrics
from .service import RolloutService
from .settings import Settings
from .state import AppState
from .taskset import Taskset, TraitsCache

logger = logging.getLogger(__name__)
T = TypeVar("T")

_STATUS_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}


def error_body(code: str, message: str, **details: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **details}, "detail": message}


async def _task_app_error(_: Request, exc: Exception) -> JSONBytes:
    if not isinstance(exc, TaskAppError):  # pragma: no cover - registered for TaskAppError only
        raise exc
    headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, CapacityExceeded) else None
    return JSONBytes(error_body(exc.code, exc.message, **exc.details), status_code=exc.status, headers=headers)


def _denied(request: Request) -> TaskAppError | None:
    """FastAPI parses a JSON body before the routes' auth dependency runs; a body error must not
    tell a caller without a valid key anything the 401/503 would not (every body route is protected)."""
    try:
        check_api_key(request, request.app.state.settings)
    except TaskAppError as exc:
        return exc
    return None


async def _validation_error(request: Request, exc: Exception) -> JSONBytes:
    if not isinstance(exc, RequestValidationError):  # pragma: no cover
        raise exc
    # Never echo `input`: a rejected policy.config may carry an api_key.
    errors = [
        {"loc": list(error.get("loc", ())), "msg": error.get("msg", ""), "type": error.get("type", "")}
        for error in exc.errors()
    ]
    if any(error["type"] == "json_invalid" for error in errors):
        if (denied := _denied(request)) is not None:
            return await _task_app_error(request, denied)
        return JSONBytes(error_body("invalid_json", "the request body is not valid JSON"), status_code=400)
    first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
    location = ".".join(str(part) for part in first["loc"] if part != "body")
    message = f"{location}: {first['msg']}" if location else str(first["msg"])
    return JSONBytes(error_body("invalid_request", message, errors=errors), status_code=422)


async def _http_error(request: Request, exc: Exception) -> JSONBytes:
    if not isinstance(exc, StarletteHTTPException):  # pragma: no cover
        raise exc
    code = _STATUS_CODES.get(exc.status_code, "http_error")
    if exc.status_code == 400:  # noqa: PLR2004 - FastAPI's "error parsing the body" (e.g. nesting too deep)
        if (denied := _denied(request)) is not None:
            return await _task_app_error(request, denied)
        code = "invalid_json"
    headers = exc.headers
    if exc.status_code == 405:  # noqa: PLR2004 - list every method of the path, not just one route's
        headers = {**(headers or {}), "Allow": allowed_methods(request)}
    return JSONBytes(error_body(code, str(exc.detail)), status_code=exc.status_code, headers=headers)


async def _unexpected_error(request: Request, exc: Exception) -> JSONBytes:
    logger.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONBytes(error_body("internal_error", "internal server error"), status_code=500)


def _offload(limiter: anyio.CapacityLimiter) -> Callable[[Callable[[], T]], Any]:
    async def offload(fn: Callable[[], T]) -> T:
        return await anyio.to_thread.run_sync(fn, limiter=limiter)

    return offload


@contextmanager
def _start_up_objects_frozen() -> Iterator[None]:
    """Move every object alive after start-up (modules, numba's compiled world generator: ~170k
    objects) out of the cyclic GC's reach while the app serves, and back at shutdown.

    A full collection otherwise walks them all with the GIL held, a stall of every rollout in flight
    (benchmarks/ B3 at 64 x 200 ms: loop lag max 200 -> 30 ms, share of the ideal 89 -> 91 %).
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    rubrics = load_rubrics(settings.rubrics_dir)
    limiter = anyio.CapacityLimiter(settings.worker_threads)
    offload = _offload(limiter)
    worlds = WorldFactory(cache_size=settings.world_cache_size)
    if settings.warm_up:
        await offload(worlds.warm_up)
    loop_lag = LoopLagProbe(settings.loop_lag_probe_s) if settings.loop_lag_probe_s > 0 else None
    async with open_session(settings.inference_max_connections) as http:
        recorder = TraceRecorder(settings, offload)
        await recorder.start()
        if loop_lag is not None:
            loop_lag.start()
        try:
            registry = RunRegistry(settings.max_concurrent_rollouts, settings.run_registry_size)
            policies = PolicyFactoryBuilder(settings, http)
            service = RolloutService(settings, worlds, registry, policies.build, recorder, offload)
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
                loop_lag=loop_lag,
            )
            logger.info("task app ready: %s", settings.service_id)
            with _start_up_objects_frozen():
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
    for router in (health.router, info.router, proxy.router, rollout.router, runs.router):
        app.include_router(router)
    # The viewer's HTML route, with its JSON errors declared for the OpenAPI schema.
    app.include_router(view.router, responses=errors(*PROTECTED, 404, 409, 422, html_route=True))
    app.add_exception_handler(TaskAppError, _task_app_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
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
    """Factory for `uvicorn --factory task_app.server:app_from_env` (used by `task-app serve --reload`)."""
    return create_app(_settings_from_env())
