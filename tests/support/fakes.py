"""A stand-in for modal.Dict (there is no Modal account here), and a clock tests move."""

from __future__ import annotations

import asyncio
import collections
import pickle
import time
from typing import Any


class FakeClock:
    """A wall clock that moves only when a test says so (`clock.now += 60`)."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class _DictMethod:
    """A method of the double, callable as `method(...)` and, as Modal's are, as `await method.aio(...)`."""

    def __init__(self, owner: FakeModalDict, name: str) -> None:
        self._owner, self._name = owner, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._owner, f"_{self._name}")(*args, **kwargs)

    async def aio(self, *args: Any, **kwargs: Any) -> Any:
        self._owner.calls[self._name] += 1
        await asyncio.sleep(self._owner.latency_s)  # a network round trip
        return self(*args, **kwargs)


class _KeysMethod(_DictMethod):
    async def aio(self, *args: Any, **kwargs: Any) -> Any:  # an async generator, as Modal's `keys.aio()`
        self._owner.calls["keys"] += 1
        await asyncio.sleep(self._owner.latency_s)
        for key in self(*args, **kwargs):
            yield key


class FakeModalDict:
    """`modal.Dict` as modal 1.6.4 documents it, for tests (there is no Modal account here).

    Keys and values are pickled on the way in and unpickled on the way out; an entry expires after 7 days
    without a read or a write; there is no compare-and-set: `put(key, value, skip_if_exists=True)` (True
    when it wrote) is the one atomic primitive; `get(key, default)`, `pop(key, default)`, `contains`,
    `keys`; every `.aio` call takes `latency_s` (tens of ms on Modal) and is counted in `calls`.
    """

    EXPIRY_S = 7 * 24 * 3600

    def __init__(self, latency_s: float = 0.0, clock: Any = None) -> None:

        self.latency_s = latency_s
        self.clock = clock or time.time
        self.calls: collections.Counter[str] = collections.Counter()
        self._entries: dict[bytes, tuple[bytes, float]] = {}
        self.get, self.put, self.pop = _DictMethod(self, "get"), _DictMethod(self, "put"), _DictMethod(self, "pop")
        self.contains, self.keys = _DictMethod(self, "contains"), _KeysMethod(self, "keys")

    def _live(self, key: bytes) -> bytes | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if self.clock() - entry[1] > self.EXPIRY_S:
            del self._entries[key]
            return None
        self._entries[key] = (entry[0], self.clock())  # a read is an access
        return entry[0]

    def _get(self, key: Any, default: Any = None) -> Any:
        raw = self._live(pickle.dumps(key))
        return default if raw is None else pickle.loads(raw)  # the double unpickles only what it pickled

    def _put(self, key: Any, value: Any, *, skip_if_exists: bool = False) -> bool:
        packed = pickle.dumps(key)
        if skip_if_exists and self._live(packed) is not None:
            return False
        self._entries[packed] = (pickle.dumps(value), self.clock())
        return True

    def _pop(self, key: Any, default: Any = None) -> Any:
        packed = pickle.dumps(key)
        raw = self._live(packed)
        if raw is None:
            return default
        del self._entries[packed]
        return pickle.loads(raw)

    def _contains(self, key: Any) -> bool:
        return self._live(pickle.dumps(key)) is not None

    def _keys(self) -> list[Any]:
        return [pickle.loads(key) for key in list(self._entries) if self._live(key) is not None]

    def __len__(self) -> int:
        return len(self._entries)
