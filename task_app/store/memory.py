"""`TASKAPP_STATE_BACKEND=memory`: the embedded default, one process, nothing to set up.

A dict on the event loop: every operation completes without yielding, so `put_if_absent` is atomic
by construction. Expired entries are dropped when read and by `purge()`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from .base import Clock, StateStore, check_key, expiry


class MemoryStore(StateStore):
    name = "memory"
    cheap_scan = True

    def __init__(self, clock: Clock = time.time) -> None:
        super().__init__(clock)
        self._entries: dict[str, tuple[bytes, float | None]] = {}

    def _live(self, key: str) -> bytes | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        value, expires_at = entry
        if expires_at is not None and expires_at <= self.clock():
            del self._entries[key]
            return None
        return value

    async def get(self, key: str) -> bytes | None:
        return self._live(check_key(key))

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return [self._live(check_key(key)) for key in keys]

    async def put(self, key: str, value: bytes, *, ttl_s: float | None = None) -> None:
        self._entries[check_key(key)] = (bytes(value), expiry(ttl_s, self.clock))

    async def put_if_absent(self, key: str, value: bytes, *, ttl_s: float | None = None) -> bool:
        if self._live(check_key(key)) is not None:
            return False
        self._entries[key] = (bytes(value), expiry(ttl_s, self.clock))
        return True

    async def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            self._entries.pop(check_key(key), None)

    async def scan(self, prefix: str) -> list[str]:
        return sorted(key for key in list(self._entries) if key.startswith(prefix) and self._live(key) is not None)

    async def purge(self) -> int:
        now = self.clock()
        expired = [key for key, (_, at) in self._entries.items() if at is not None and at <= now]
        for key in expired:
            del self._entries[key]
        return len(expired)

    def __len__(self) -> int:
        return len(self._entries)
