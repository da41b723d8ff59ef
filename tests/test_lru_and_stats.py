"""core.lru and core.stats: `LruMap` (the run registry's budgets are in tests/test_run_registry.py), the percentile."""

from __future__ import annotations

import pytest

from task_app.core.lru import LruMap
from task_app.core.stats import percentile


def test_the_least_recently_used_goes_first() -> None:
    cache: LruMap[str, int] = LruMap(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # a use: "b" is now the oldest
    cache.put("c", 3)
    assert (cache.get("b"), cache.get("a"), cache.get("c"), len(cache)) == (None, 1, 3, 2)


def test_reads_without_touch_keep_insertion_order() -> None:
    cache: LruMap[str, int] = LruMap(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a", touch=False) == 1
    cache.put("c", 3)
    assert cache.get("a") is None and cache.get("b") == 2


def test_the_weight_bound_drops_the_oldest_until_it_fits() -> None:
    cache: LruMap[str, bytes] = LruMap(10, max_weight=10, weight=len)
    cache.put("a", b"1234")
    cache.put("b", b"1234")
    cache.put("a", b"12")  # a replacement is re-weighed and counts as a use
    assert cache.total_weight == 6
    cache.put("c", b"123456")  # 12 > 10: "b", the oldest, goes
    assert (cache.get("b"), cache.total_weight, len(cache)) == (None, 8, 2)
    cache.put("d", b"x" * 11)  # heavier than the bound alone: nothing stays
    assert (len(cache), cache.total_weight) == (0, 0)


def test_a_size_of_zero_keeps_nothing() -> None:
    cache: LruMap[int, int] = LruMap(0)
    cache.put(1, 1)
    assert cache.get(1) is None and len(cache) == 0


def test_put_returns_what_it_dropped_and_pop_takes_one_out() -> None:
    cache: LruMap[str, bytes] = LruMap(3, max_weight=10, weight=len)
    assert cache.put("a", b"1234") == [] and cache.put("b", b"1234") == []
    assert cache.put("c", b"123") == [("a", b"1234")]  # 11 > 10
    assert cache.pop("b") == b"1234" and cache.pop("b") is None
    assert (len(cache), cache.total_weight) == (1, 3)


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([3.0, 1.0, 2.0], 50, 2.0),
        (list(range(1, 101)), 99, 99),
        (list(range(1, 101)), 29, 29),  # 0.29 * 100 is 28.999...: the rank stays 29
        (list(range(1, 11)), 90, 9),
        ([5.0], 0, 5.0),
        ([1.0, 2.0], 100, 2.0),
    ],
)
def test_percentile_is_the_nearest_rank(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == expected


def test_percentile_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
