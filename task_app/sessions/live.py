"""The envs one process holds live: a bounded LRU of games, each with its own lock and rate bucket.

A live env is a cache of its record in the state store: evicting one loses nothing (the next request
rebuilds it from the store), so the cache only bounds memory. Entries in use (their lock held) are
never evicted; when every entry is in use and the cache is full, a new env waits for nothing and is
refused with 429 `too_many_live_envs`.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from ..core.errors import RateLimited
from ..game import Game
from .records import EnvMeta


@dataclass(slots=True)
class RateBucket:
    """A token bucket: `rate` requests per second, bursts of up to one second's worth."""

    rate: float
    tokens: float = -1.0
    stamp: float = 0.0

    def take(self, now: float) -> float:
        """Take one token; returns 0 when allowed, else the seconds until one is available."""
        if self.tokens < 0:
            self.tokens, self.stamp = self.rate, now
        self.tokens = min(self.rate, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


@dataclass(frozen=True, slots=True)
class Episode:
    """Where an env is in its episodes: derived from its log, and carried by its checkpoints."""

    number: int = 1  # episodes started (1 at creation, +1 per reset)
    calls: int = 0  # step calls that ran in this episode (OpenEnv's step_count)
    episode_id: str | None = None  # what the reset that started it named it (OpenEnv's episode_id)

    def next(self, episode_id: str | None) -> Episode:
        return Episode(self.number + 1, 0, episode_id)

    def stepped(self) -> Episode:
        return Episode(self.number, self.calls + 1, self.episode_id)

    def as_extra(self) -> dict[str, Any]:
        return {"episode": self.number, "calls": self.calls, "eid": self.episode_id}

    @classmethod
    def from_extra(cls, extra: dict[str, Any]) -> Episode:
        eid = extra.get("eid")
        return cls(int(extra.get("episode", 1)), int(extra.get("calls", 0)), str(eid) if eid is not None else None)


@dataclass(slots=True)
class LiveEnv:
    meta: EnvMeta
    game: Game
    episode: Episode
    head: int  # log entries applied: the index the next entry claims
    slot_at: float  # wall-clock time of the slot's last refresh known to this process
    bucket: RateBucket
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    used_at: float = 0.0  # monotonic
    snapshot_hint: int = 0  # where to start probing the env's snapshot slots

    @property
    def env_id(self) -> str:
        return self.meta.env_id

    @property
    def seed(self) -> int:
        return int(self.game.env._seed)


class LiveCache:
    def __init__(self, capacity: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = capacity
        self._clock = clock
        self._entries: OrderedDict[str, LiveEnv] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, env_id: str) -> LiveEnv | None:
        live = self._entries.get(env_id)
        if live is not None:
            self._entries.move_to_end(env_id)
            live.used_at = self._clock()
        return live

    def make_room(self) -> None:
        """Evict idle entries until one more fits; 429 when every entry is in use."""
        while len(self._entries) >= self.capacity:
            idle = next((key for key, live in self._entries.items() if not live.lock.locked()), None)
            if idle is None:
                raise RateLimited(
                    f"{len(self._entries)} envs are live in this process (the limit); retry later",
                    code="too_many_live_envs",
                    limit=self.capacity,
                )
            self.evict(idle)

    def add(self, live: LiveEnv) -> LiveEnv:
        """Insert (or replace) `live`, evicting an idle entry if the cache is full."""
        if live.env_id not in self._entries:
            self.make_room()
        live.used_at = self._clock()
        self._entries[live.env_id] = live
        self._entries.move_to_end(live.env_id)
        return live

    def drop(self, env_id: str) -> None:
        """Out of the cache; its game stays whole, for a request that may still wait for its lock."""
        self._entries.pop(env_id, None)

    def evict(self, env_id: str) -> None:
        """Out of the cache and its world freed now (`Game.close`): only for an entry not in use (not
        locked, so no request holds it or waits for it; the lock passes straight to a waiter)."""
        live = self._entries.pop(env_id, None)
        if live is not None:
            live.game.close()

    def idle_since(self, cutoff: float) -> list[str]:
        """Ids of entries not used since `cutoff` (monotonic) and not in use."""
        return [key for key, live in self._entries.items() if live.used_at < cutoff and not live.lock.locked()]


def retry_after(seconds: float) -> int:
    return max(1, math.ceil(seconds))
