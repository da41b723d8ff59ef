"""numba's `njit` as the game layer uses it: compiled once and cached on disk, the GIL released."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

from numba import njit

F = TypeVar("F", bound=Callable[..., Any])


def compiled(function: F) -> F:
    """`function` compiled in nopython mode (plain Python under NUMBA_DISABLE_JIT), its signature kept."""
    return cast(F, njit(cache=True, nogil=True)(function))
