"""What the lifespan opens for env sessions: the state store, the sessions, OpenEnv's tokens and
WebSocket cap, the tool sessions, and the reaper that runs `EnvSessions.maintain` while the app serves."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio

from ..core.errors import StoreUnavailable
from ..core.offload import Offload
from ..core.settings import Settings
from ..core.tasks import Tasks
from ..game import WorldFactory
from ..store import StateStore, open_store
from .env_spec import SessionLimits
from .manager import EnvSessions
from .openenv import WsCapacity
from .openenv_tokens import TokenRegistry
from .tools import ToolSessions

logger = logging.getLogger(__name__)

MAX_REAPER_INTERVAL_S = 30.0


@dataclass(slots=True)
class SessionServices:
    store: StateStore
    envs: EnvSessions
    tokens: TokenRegistry
    websockets: WsCapacity
    tools: ToolSessions  # the tools and sessions every standard door shares (OpenEnv MCP, MCP, ORS)


def reaper_interval(ttl_s: float) -> float:
    return min(ttl_s / 4, MAX_REAPER_INTERVAL_S)


async def _reap(envs: EnvSessions, interval_s: float) -> None:
    while True:
        await anyio.sleep(interval_s)
        try:
            done = await envs.maintain()
        except StoreUnavailable as exc:
            logger.warning("env-session reaper: %s", exc.message)
            continue
        if done["reaped"] or done["evicted"]:
            logger.info("env-session reaper: %s", done)


@asynccontextmanager
async def open_sessions(settings: Settings, worlds: WorldFactory, offload: Offload) -> AsyncIterator[SessionServices]:
    limits = SessionLimits.from_settings(settings)
    async with open_store(settings.state_backend) as store, anyio.create_task_group() as tasks:
        envs = EnvSessions(store, worlds, limits, offload, tasks=Tasks(settings))
        services = SessionServices(
            store,
            envs,
            TokenRegistry(store, settings.openenv_token_ttl_s),
            WsCapacity(settings.openenv_max_sessions),
            ToolSessions(envs, settings),
        )
        tasks.start_soon(_reap, envs, reaper_interval(limits.ttl_s))
        logger.info("env sessions on the %s state store", store.name)
        yield services
        tasks.cancel_scope.cancel()
