"""How many asyncio tasks are alive, for `/health`: kept up to date by a task factory instead of counted
by walking every task on each call. `asyncio.all_tasks()` walks every task, thousands with a thousand
rollouts in flight, and `/health` is polled many times a second (docs/performance.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class TaskCount:
    """The tasks of one loop not done yet: those alive when it was installed, and every one since."""

    def __init__(self, previous: Any) -> None:
        self.live = 0
        self._previous = previous  # the loop's factory before, or None (asyncio's type for it is private)

    def _factory(self, loop: asyncio.AbstractEventLoop, coro: Any, /, **kwargs: Any) -> asyncio.Future[Any]:
        previous = self._previous
        task: asyncio.Future[Any] = (
            previous(loop, coro, **kwargs) if previous is not None else asyncio.Task(coro, loop=loop, **kwargs)
        )
        self._track(task)
        return task

    def _track(self, task: asyncio.Future[Any]) -> None:
        self.live += 1
        task.add_done_callback(self._done)

    def _done(self, _task: asyncio.Future[Any]) -> None:
        self.live -= 1


@contextmanager
def counted_tasks() -> Iterator[TaskCount]:
    """Count the running loop's tasks while the block runs (its previous task factory kept underneath)."""
    loop = asyncio.get_running_loop()
    previous = loop.get_task_factory()
    count = TaskCount(previous)
    for task in asyncio.all_tasks(loop):
        count._track(task)
    loop.set_task_factory(count._factory)
    try:
        yield count
    finally:
        loop.set_task_factory(previous)
