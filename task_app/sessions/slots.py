"""Caps without counters: a bounded set of slot keys, each claimed with put_if_absent and held with a TTL.

    slots/<i>                  i < TASKAPP_SESSIONS_MAX_ENVS: {"env": id, "at": last refresh}, TTL = the
                               idle TTL; claimed at creation, refreshed while the env is used, deleted
                               when it ends; a lapsed slot is an expired env (and a free slot)
    env/<id>/snap-slot/<k>     k < TASKAPP_SESSIONS_MAX_SNAPSHOTS: one unexpired snapshot each

The store has no atomic counter (modal.Dict has none), but it can say "this key was free and now it is
mine": so a full set of slots is a full store, on every backend, and a slot frees itself when its
holder stops refreshing it.
"""

from __future__ import annotations

import random

from ..core.errors import RateLimited
from ..core.json_codec import dumps_bytes, loads
from ..store import StateStore
from .env_spec import SessionLimits
from .live import retry_after
from .records import slot_key, snapshot_slot_key

SLOT_PROBES = 32  # random slots tried before a create is refused (all of them when there are fewer)
FULL_STORE_RETRY_S = 5


class Slots:
    def __init__(self, store: StateStore, limits: SessionLimits) -> None:
        self.store = store
        self.limits = limits

    async def claim(self, env_id: str) -> int:
        """A free env slot for `env_id`, or 429 `too_many_envs`."""
        value = dumps_bytes({"env": env_id, "at": self.store.clock()})
        total = self.limits.max_envs
        candidates = random.sample(range(total), total) if total <= SLOT_PROBES else None
        for attempt in range(min(total, SLOT_PROBES)):
            index = candidates[attempt] if candidates is not None else random.randrange(total)
            if await self.store.put_if_absent(slot_key(index), value, ttl_s=self.limits.ttl_s):
                return index
        raise RateLimited(
            f"the state store holds {total} envs (TASKAPP_SESSIONS_MAX_ENVS); terminate some or retry later",
            code="too_many_envs",
            retry_after_s=FULL_STORE_RETRY_S,
            limit=total,
        )

    async def held_since(self, index: int, env_id: str) -> float | None:
        """When slot `index` was last refreshed, if `env_id` (still) holds it."""
        raw = await self.store.get(slot_key(index))
        if raw is None:
            return None
        value = loads(raw)
        return float(value["at"]) if value.get("env") == env_id else None

    async def refresh(self, index: int, env_id: str, now: float) -> None:
        await self.store.put(slot_key(index), dumps_bytes({"env": env_id, "at": now}), ttl_s=self.limits.ttl_s)

    async def release(self, index: int, env_id: str) -> None:
        if await self.held_since(index, env_id) is not None:
            await self.store.delete([slot_key(index)])

    async def claim_snapshot(self, env_id: str, snapshot_id: str, start: int) -> int:
        """One of the env's snapshot slots (probing from `start`); the index to start from next time.
        When all are held: 429 `too_many_snapshots`, retry when the oldest snapshot expires."""
        now, total = self.store.clock(), self.limits.max_snapshots
        value = dumps_bytes({"snapshot": snapshot_id, "at": now})
        for offset in range(total):
            index = (start + offset) % total
            if await self.store.put_if_absent(snapshot_slot_key(env_id, index), value, ttl_s=self.limits.ttl_s):
                return index + 1
        held = await self.store.get_many([snapshot_slot_key(env_id, index) for index in range(total)])
        oldest = min((float(loads(raw)["at"]) for raw in held if raw is not None), default=now)
        raise RateLimited(
            f"env {env_id!r} has {total} unexpired snapshots (TASKAPP_SESSIONS_MAX_SNAPSHOTS)",
            code="too_many_snapshots",
            retry_after_s=retry_after(oldest + self.limits.ttl_s - now),
            limit=total,
        )
