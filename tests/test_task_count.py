"""/health's task count: kept by a task factory, equal to asyncio's own count of live tasks."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from task_app.web.task_count import counted_tasks

pytestmark = pytest.mark.anyio


async def test_the_count_follows_tasks_as_they_start_and_end() -> None:
    baseline = len(asyncio.all_tasks())
    before = asyncio.create_task(asyncio.sleep(0.05))  # alive when the count starts
    with counted_tasks() as count:
        assert count.live == len(asyncio.all_tasks()) == baseline + 1
        gate = asyncio.Event()
        waiting = [asyncio.create_task(gate.wait()) for _ in range(5)]
        failing = asyncio.create_task(asyncio.wait_for(gate.wait(), timeout=0))
        assert count.live == len(asyncio.all_tasks()) == baseline + 7
        waiting[0].cancel()
        gate.set()
        await asyncio.gather(*waiting, failing, before, return_exceptions=True)
        for _ in range(2):  # a task's done callbacks run in the loop iteration after it ends
            await asyncio.sleep(0)
        assert count.live == len(asyncio.all_tasks()) == baseline
    assert asyncio.get_running_loop().get_task_factory() is None


async def test_a_factory_installed_before_keeps_making_the_tasks() -> None:
    loop = asyncio.get_running_loop()
    made: list[str] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, /, **kwargs: Any) -> asyncio.Future[Any]:
        made.append("task")
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)
    try:
        with counted_tasks() as count:
            await asyncio.create_task(asyncio.sleep(0))
            await asyncio.sleep(0)
            assert made == ["task"] and count.live == len(asyncio.all_tasks())
        assert loop.get_task_factory() is factory
    finally:
        loop.set_task_factory(None)
