"""The state-store interface: a small key-value store of bytes with one atomic primitive.

    get(key) / get_many(keys)          the value, or None (absent or expired)
    put(key, value, ttl_s=None)        write (overwrite)
    put_if_absent(key, value, ttl_s)   write only if absent (or expired): True if this call wrote it
    delete(keys)                       remove (absent keys are fine)
    scan(prefix)                       the keys under a prefix (cheap on memory and sqlite only)
    purge()                            drop expired entries now (backends also drop them lazily)

Why so small: `modal.Dict` (the production backend) has no transactions and no compare-and-set; its
one atomic primitive is `put(key, value, skip_if_exists=True)`. Everything built on the store (env
sessions here; the fleet-wide run registry, abort flags and stored responses later) is written against
these operations only, so it behaves the same on every backend: ordering by claiming a fresh key with
`put_if_absent` (one writer wins), never by read-modify-write of a shared key.

Values are bytes this app made (JSON, or the sessions' own checkpoint format); nothing a client sent is
ever stored raw and nothing read back is unpickled by us. A TTL is absolute (seconds from the write, on
the wall clock, so processes agree); an expired entry reads as absent and may be claimed again.
"""

from __future__ import annotations

import abc
import re
import time
from collections.abc import Callable, Sequence

from ..core.errors import StoreUnavailable

__all__ = ["Clock", "StateStore", "StoreUnavailable", "check_key", "expiry"]

Clock = Callable[[], float]
MAX_KEY_LENGTH = 512
_KEY = re.compile(r"^[A-Za-z0-9_./:=-]+$")


def check_key(key: str) -> str:
    """Keys are built by this app from validated parts; anything else is a bug, caught here."""
    if not key or len(key) > MAX_KEY_LENGTH or not _KEY.match(key):
        raise ValueError(f"invalid state-store key {key[:80]!r}")
    return key


def expiry(ttl_s: float | None, clock: Clock) -> float | None:
    if ttl_s is None:
        return None
    if ttl_s <= 0:
        raise ValueError("ttl_s must be positive")
    return clock() + ttl_s


class StateStore(abc.ABC):
    """One backend instance per process; open it in the lifespan and `close()` it at shutdown."""

    name: str = "abstract"
    cheap_scan: bool = False  # scan() and bulk deletes cost about one call, not one per key

    def __init__(self, clock: Clock = time.time) -> None:
        self.clock = clock

    @abc.abstractmethod
    async def get(self, key: str) -> bytes | None: ...

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return [await self.get(key) for key in keys]

    @abc.abstractmethod
    async def put(self, key: str, value: bytes, *, ttl_s: float | None = None) -> None: ...

    @abc.abstractmethod
    async def put_if_absent(self, key: str, value: bytes, *, ttl_s: float | None = None) -> bool: ...

    @abc.abstractmethod
    async def delete(self, keys: Sequence[str]) -> None: ...

    @abc.abstractmethod
    async def scan(self, prefix: str) -> list[str]: ...

    async def purge(self) -> int:
        """Drop expired entries; returns how many. Backends without native expiry return 0."""
        return 0

    async def close(self) -> None:
        return None
