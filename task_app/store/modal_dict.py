"""`TASKAPP_STATE_BACKEND=modal-dict:NAME`: a named `modal.Dict`, shared by every container of the app.

What the backend relies on is only what `modal.Dict` documents (modal 1.6.4, `modal/dict.py`):
`Dict.from_name(name, create_if_missing=True)`; `get`, `put(..., skip_if_exists=...)` (True when it
wrote: the one atomic primitive, there is no compare-and-set), `pop`, `keys`, each called through its
`.aio` variant so the event loop never blocks; values are pickled by Modal (we hand it `bytes` of our
own making, so what it unpickles is a bytes object); an entry expires after 7 days without a read or a
write; every call is a network round trip (tens of ms), so `get_many` and `delete` run their calls
concurrently, `cheap_scan` is False and callers avoid `scan`.

A TTL is kept in a small header of the value (Modal has no per-entry expiry): an expired entry reads
as absent. `put_if_absent` on a key whose entry expired cannot be one call: it pops the stale entry
and claims the key again. If another container claimed the key between our read and our pop, we give
its entry back and report a loss; the one race left (a third claimant in that same round trip) can
only affect keys written with a TTL, never the TTL-less keys that order env steps.

Tests run this backend against a double with those semantics (tests/helpers.py `FakeModalDict`):
there is no Modal account here.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from .base import Clock, StateStore, StoreUnavailable, check_key, expiry

T = TypeVar("T")
CONCURRENCY = 32  # calls in flight per get_many / delete
_PLAIN, _TIMED = b"\x00", b"\x01"
_EXPIRES = struct.Struct(">d")


def _wrap(value: bytes, expires_at: float | None) -> bytes:
    if expires_at is None:
        return _PLAIN + value
    return _TIMED + _EXPIRES.pack(expires_at) + value


def _unwrap(raw: object, now: float) -> bytes | None:
    """The payload of a stored value, or None when absent, expired or not ours."""
    if not isinstance(raw, bytes) or not raw:
        return None
    if raw[:1] == _PLAIN:
        return raw[1:]
    if raw[:1] == _TIMED and len(raw) > _EXPIRES.size:
        (expires_at,) = _EXPIRES.unpack_from(raw, 1)
        return raw[1 + _EXPIRES.size :] if expires_at > now else None
    return None


class ModalDictStore(StateStore):
    name = "modal-dict"
    cheap_scan = False

    def __init__(
        self, handle: Any, *, errors: tuple[type[Exception], ...] = (OSError,), clock: Clock = time.time
    ) -> None:
        """`handle`: a `modal.Dict` (see `from_name`) or an object with the same methods; `errors`: what
        its calls raise when the service fails (reported as 503 `state_store_unavailable`)."""
        super().__init__(clock)
        self._dict = handle
        self._errors: tuple[type[Exception], ...] = (*errors, TimeoutError, ConnectionError)
        self._limit = asyncio.Semaphore(CONCURRENCY)

    @classmethod
    def from_name(cls, name: str) -> ModalDictStore:
        import modal  # only the modal-dict backend needs the SDK (installed in Modal's containers)

        return cls(modal.Dict.from_name(name, create_if_missing=True), errors=(modal.exception.Error, OSError))

    async def _call(self, call: Callable[[], Awaitable[T]]) -> T:
        async with self._limit:
            try:
                return await call()
            except self._errors as exc:
                raise StoreUnavailable(f"modal.Dict call failed: {type(exc).__name__}: {exc}") from exc

    async def get(self, key: str) -> bytes | None:
        raw = await self._call(lambda: self._dict.get.aio(check_key(key)))
        return _unwrap(raw, self.clock())

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return list(await asyncio.gather(*(self.get(key) for key in keys)))

    async def put(self, key: str, value: bytes, *, ttl_s: float | None = None) -> None:
        wrapped = _wrap(bytes(value), expiry(ttl_s, self.clock))
        await self._call(lambda: self._dict.put.aio(check_key(key), wrapped))

    async def _claim(self, key: str, wrapped: bytes) -> bool:
        created = await self._call(lambda: self._dict.put.aio(key, wrapped, skip_if_exists=True))
        return bool(created)

    async def put_if_absent(self, key: str, value: bytes, *, ttl_s: float | None = None) -> bool:
        check_key(key)
        wrapped = _wrap(bytes(value), expiry(ttl_s, self.clock))
        if await self._claim(key, wrapped):
            return True
        current = await self._call(lambda: self._dict.get.aio(key))
        if current is None:  # popped since our claim failed
            return await self._claim(key, wrapped)
        if _unwrap(current, self.clock()) is not None:
            return False
        popped = await self._call(lambda: self._dict.pop.aio(key, None))
        if popped is not None and _unwrap(popped, self.clock()) is not None:
            await self._call(lambda: self._dict.put.aio(key, popped))  # another claimant's entry: give it back
            return False
        return await self._claim(key, wrapped)

    async def delete(self, keys: Sequence[str]) -> None:
        async def pop(key: str) -> None:
            await self._call(lambda: self._dict.pop.aio(check_key(key), None))

        await asyncio.gather(*(pop(key) for key in keys))

    async def scan(self, prefix: str) -> list[str]:
        """Every key under `prefix`: a walk over the whole Dict (Modal has no range query); avoid."""
        check_key(prefix)

        async def walk() -> list[str]:
            return [key async for key in self._dict.keys.aio() if isinstance(key, str) and key.startswith(prefix)]

        keys = await self._call(walk)
        values = await self.get_many(keys)
        return sorted(key for key, value in zip(keys, values, strict=True) if value is not None)
