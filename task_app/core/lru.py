"""A bounded map that drops its least recently used entries first (world snapshots, traits, finished runs)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruMap(Generic[K, V]):
    """At most `max_items` entries and, given `weight`, at most `max_weight` of it in total.

    `put` (a new key or a replacement) and `get` count as a use; `get(key, touch=False)` reads without
    one, for a map that drops in insertion order. An entry's weight is taken when it is put. Not
    thread-safe: an owner shared between threads holds its own lock around every call.
    """

    def __init__(self, max_items: int, *, max_weight: int | None = None, weight: Callable[[V], int] | None = None):
        self.max_items = max_items
        self.max_weight = max_weight
        self.total_weight = 0
        self._weight = weight
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: K, *, touch: bool = True) -> V | None:
        item = self._items.get(key)
        if item is None:
            return None
        if touch:
            self._items.move_to_end(key)
        return item[0]

    def put(self, key: K, value: V) -> list[tuple[K, V]]:
        """Store `value` under `key`; returns the entries dropped to make room (oldest first)."""
        previous = self._items.pop(key, None)
        if previous is not None:
            self.total_weight -= previous[1]
        weight = self._weight(value) if self._weight is not None else 0
        self._items[key] = (value, weight)
        self.total_weight += weight
        dropped: list[tuple[K, V]] = []
        while self._items and (len(self._items) > self.max_items or self._too_heavy()):
            old_key, (old_value, old_weight) = self._items.popitem(last=False)
            self.total_weight -= old_weight
            dropped.append((old_key, old_value))
        return dropped

    def pop(self, key: K) -> V | None:
        item = self._items.pop(key, None)
        if item is None:
            return None
        self.total_weight -= item[1]
        return item[0]

    def _too_heavy(self) -> bool:
        return self.max_weight is not None and self.total_weight > self.max_weight
