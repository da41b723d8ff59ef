"""core.pacing: a wave of decisions spread over event-loop iterations, in order, on a real loop."""

from __future__ import annotations

import asyncio
from time import perf_counter

import pytest

from task_app.core.pacing import LoopPacer

pytestmark = pytest.mark.anyio

WORK_S = 0.002  # a decision's loop work in these tests (busy: it holds the loop like Python does)


def _work() -> None:
    end = perf_counter() + WORK_S
    while perf_counter() < end:
        pass


async def _wave(pacer: LoopPacer | None, n: int, order: list[int]) -> float:
    """`n` tasks woken in one iteration, each doing WORK_S of loop work; the lateness of a timer due
    1 ms into the wave, in seconds."""
    start = asyncio.Event()

    async def decision(i: int) -> None:
        await start.wait()
        if pacer is not None:
            await pacer.turn()
        _work()
        order.append(i)

    loop = asyncio.get_running_loop()
    tasks = [asyncio.create_task(decision(i)) for i in range(n)]
    await asyncio.sleep(0)  # every task waits on the event
    fired = loop.create_future()
    due = loop.time() + 0.001
    loop.call_at(due, lambda: fired.set_result(loop.time()))
    start.set()
    await asyncio.gather(*tasks)
    return float(await fired) - due


async def test_a_wave_leaves_room_for_timers_between_its_decisions() -> None:
    unpaced: list[int] = []
    late_unpaced = await _wave(None, 50, unpaced)
    paced: list[int] = []
    pacer = LoopPacer(budget_s=0.004)
    late_paced = await _wave(pacer, 50, paced)
    assert late_unpaced > 0.08  # the timer waited for the whole wave (50 x 2 ms)
    assert late_paced < 0.05  # a few decisions ran before it
    assert paced == list(range(50))  # in the order the decisions woke
    assert pacer.waiting == 0


async def test_a_lone_turn_does_not_wait() -> None:
    pacer = LoopPacer(budget_s=0.004)
    ran = []
    asyncio.get_running_loop().call_soon(ran.append, "next iteration")
    for _ in range(3):
        await pacer.turn()
    assert ran == []  # no turn suspended: the callback of the next iteration has not run


async def test_a_cancelled_turn_leaves_the_queue_moving() -> None:
    pacer = LoopPacer(budget_s=0.001)
    start = asyncio.Event()
    done: list[int] = []

    async def decision(i: int) -> None:
        await start.wait()
        await pacer.turn()
        _work()
        done.append(i)

    tasks = [asyncio.create_task(decision(i)) for i in range(10)]
    await asyncio.sleep(0)
    start.set()
    for _ in range(5):
        await asyncio.sleep(0)
        if pacer.waiting:
            break
    assert pacer.waiting >= 3
    queued = tasks[-3:]  # released last: still waiting
    for task in queued:
        task.cancel()
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=5)
    assert len(done) == 10 - len(queued)
    assert pacer.waiting == 0
