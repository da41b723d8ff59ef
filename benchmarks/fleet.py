"""B9 fleet: what the run registry in the state store costs a rollout, and how fast it acts across processes.

store calls    per rollout, counted on a wrapper of the store the registry uses (in-process, the
               registry's own code): a sync POST /rollout, an async one run where it was accepted,
               one handed over (Modal's path); per status read from another process; and per
               process and second for the heartbeat and the abort bell
server CPU     per 10-decision rollout (zero-latency model, tracing on), on the memory and the sqlite
               backend, two servers alternated request by request: the sqlite extra is what a shared
               store adds; the registry's own CPU per rollout in-process (admit + finish) beside it
modal-dict     wall time the registry adds to a rollout on the modal-dict double with 20 ms calls
               (a simulation of Modal's round trips: there is no Modal account here)
abort          from one app process to a rollout on another (sqlite), until the rollout's POST answered
heartbeat      bytes of one heartbeat of a process holding 64 runs
"""

from __future__ import annotations

import collections
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import anyio

from task_app.rollout.control import RunStatus
from task_app.rollout.fleet import FleetRuns, RunLimits
from task_app.rollout.registry import RunEntry, RunRegistry
from task_app.store import StateStore
from task_app.store.memory import MemoryStore
from task_app.store.modal_dict import ModalDictStore
from task_app.store.sqlite import SqliteStore

from .client import client, post_rollout, rollout_body
from .processes import Served, app_server, fake_model
from .report import Figure, median_of
from .sessions import modal_dict_double

BENCH = "B9"
LIMITS = RunLimits(ttl_s=86_400, result_ttl_s=3600, heartbeat_s=2, lost_after_s=30)
RESPONSE = b"x" * 20_000  # a 10-decision response is about this size
DECISIONS = 10
ABORTS = 5  # per repetition: the wait for the owner's next bell poll is uniform over the interval


class CountingStore(StateStore):
    """A store that counts the calls made on it (a call of `get_many` is one round trip)."""

    def __init__(self, inner: StateStore) -> None:
        super().__init__(inner.clock)
        self.inner = inner
        self.calls: collections.Counter[str] = collections.Counter()

    async def get(self, key: str) -> bytes | None:
        self.calls["get"] += 1
        return await self.inner.get(key)

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        self.calls["get_many"] += 1
        return await self.inner.get_many(keys)

    async def put(self, key: str, value: bytes, *, ttl_s: float | None = None) -> None:
        self.calls["put"] += 1
        await self.inner.put(key, value, ttl_s=ttl_s)

    async def put_if_absent(self, key: str, value: bytes, *, ttl_s: float | None = None) -> bool:
        self.calls["put_if_absent"] += 1
        return await self.inner.put_if_absent(key, value, ttl_s=ttl_s)

    async def delete(self, keys: Sequence[str]) -> None:
        self.calls["delete"] += 1
        await self.inner.delete(keys)

    async def scan(self, prefix: str) -> list[str]:
        self.calls["scan"] += 1
        return await self.inner.scan(prefix)

    def take(self) -> int:
        total = sum(self.calls.values())
        self.calls.clear()
        return total


def _registry(store: StateStore, name: str) -> RunRegistry:
    return RunRegistry(FleetRuns(store, name, LIMITS), 256)


async def _call_counts() -> dict[str, int]:
    store = CountingStore(MemoryStore())
    here, other = _registry(store, "here"), _registry(store, "other")
    counts: dict[str, int] = {}
    entry = await here.admit("sync-1")
    assert isinstance(entry, RunEntry)
    await here.finish(entry, RunStatus.COMPLETED, RESPONSE)
    counts["sync"] = store.take()
    queued = (await here.accept("async-1")).entry
    assert queued is not None
    await here.take_slot(queued)
    await here.finish(queued, RunStatus.COMPLETED, RESPONSE)
    counts["async_here"] = store.take()
    accepted = await here.accept("handed-1", request=b"{}" * 500)
    await here.fleet.mark_queued("handed-1", accepted.view.attempt)
    taken = await other.take_over("handed-1", 0)
    assert taken is not None
    await other.fleet.request("handed-1", 0)
    await other.take_slot(taken)
    await other.finish(taken, RunStatus.COMPLETED, RESPONSE)
    counts["handed_over"] = store.take()
    running = await here.admit("watched")
    assert isinstance(running, RunEntry)
    await here.beat()
    store.take()
    await other.status("watched")
    counts["status_elsewhere"] = store.take()
    await here.finish(running, RunStatus.COMPLETED, RESPONSE)
    store.take()
    await other.result("watched")
    counts["result_elsewhere"] = store.take()
    return counts


async def _registry_cpu_ms(store: StateStore, rollouts: int) -> float:
    """Process CPU of admit + finish per rollout on `store` (the registry's whole share of a rollout)."""
    registry = _registry(store, "cpu")
    started = time.process_time()
    for index in range(rollouts):
        entry = await registry.admit(f"cpu-{index}-{time.monotonic_ns()}")
        assert isinstance(entry, RunEntry)
        await registry.finish(entry, RunStatus.COMPLETED, RESPONSE)
    return (time.process_time() - started) / rollouts * 1000


async def _registry_cpu_on_sqlite(path: Path, rollouts: int) -> float:
    store = await SqliteStore(path).open()
    try:
        return await _registry_cpu_ms(store, rollouts)
    finally:
        await store.close()


async def _modal_wall_ms(rounds: int) -> tuple[float, float]:
    """Wall ms of admit and of finish on the modal-dict double with 20 ms calls."""
    registry = _registry(ModalDictStore(modal_dict_double()(latency_s=0.02)), "modal")
    admit, finish = [], []
    for index in range(rounds):
        started = time.perf_counter()
        entry = await registry.admit(f"modal-{index}")
        admitted = time.perf_counter()
        assert isinstance(entry, RunEntry)
        await registry.finish(entry, RunStatus.COMPLETED, RESPONSE)
        admit.append(admitted - started)
        finish.append(time.perf_counter() - admitted)
    return median_of(admit) * 1000, median_of(finish) * 1000


async def _heartbeat_bytes(runs: int) -> int:
    store = MemoryStore()
    registry = _registry(store, "beat")
    for index in range(runs):
        entry = await registry.admit(f"bench-{index:04d}-{time.monotonic_ns()}")
        assert isinstance(entry, RunEntry)
        entry.control.progress.update(
            ops_executed=40, decisions=20, episodes=1, achievements=["collect_wood", "place_table", "collect_sapling"]
        )
    await registry.beat()
    raw = await store.get("proc/beat/live")
    return len(raw or b"")


async def _server_cpu_ms(apps: Sequence[Served], model_url: str, rollouts: int) -> list[float]:
    """CPU ms per rollout on each server, the servers alternated rollout by rollout."""
    spent = [0.0] * len(apps)
    async with client(2) as http:
        for _ in range(rollouts):
            for index, app in enumerate(apps):
                before = app.cpu_s()
                outcome = await post_rollout(http, app.url, rollout_body(model_url, 7, DECISIONS))
                spent[index] += app.cpu_s() - before
                if outcome.decisions != DECISIONS:
                    raise RuntimeError(f"{outcome.decisions} decisions, expected {DECISIONS}")
    return [total / rollouts * 1000 for total in spent]


async def _abort_ms(first: Served, second: Served, model_url: str) -> float:
    """Seconds from `POST /run/abort` on `second` to the answer of the rollout running on `first`."""
    body = rollout_body(model_url, 7, 500, latency_ms=50)
    answered: list[float] = []
    async with client(4) as http:

        async def run() -> None:
            await post_rollout(http, first.url, body)
            answered.append(time.perf_counter())

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(run)
            await _wait_running(http, second.url, body["run_id"])
            asked = time.perf_counter()
            async with http.post(second.url + "/run/abort", json={"run_id": body["run_id"]}) as response:
                await response.read()
    return (answered[0] - asked) * 1000


async def _wait_running(http: aiohttp.ClientSession, url: str, run_id: str) -> None:
    while True:
        async with http.get(f"{url}/runs/{run_id}") as response:
            data: dict[str, Any] = await response.json() if response.status == 200 else {}
        if data.get("progress", {}).get("decisions", 0) >= 3:
            return
        await anyio.sleep(0.05)


def _figure(name: str, label: str, unit: str, digits: int = 2) -> Figure:
    return Figure(BENCH, name, label, unit, digits=digits)


def run(repetitions: int, quick: bool) -> list[Figure]:
    rollouts = 10 if quick else 30
    counts = anyio.run(_call_counts)
    calls = [
        _figure(f"calls_{name}", f"store calls: {what}", "calls", 0)
        for name, what in (
            ("sync", "a POST /rollout (claim, response, end)"),
            ("async_here", "a POST /rollouts run where it was accepted"),
            ("handed_over", "a POST /rollouts handed over (Modal: claim + request, queued, start, abort check, ...)"),
            ("status_elsewhere", "a status read on another process"),
            ("result_elsewhere", "a result read on another process"),
        )
    ]
    for figure in calls:
        figure.values.append(counts[figure.name.removeprefix("calls_")])
    memory_cpu = _figure("memory_cpu_ms", f"server CPU per {DECISIONS}-decision rollout, memory backend", "ms")
    sqlite_cpu = _figure("sqlite_cpu_ms", f"server CPU per {DECISIONS}-decision rollout, sqlite backend", "ms")
    extra = _figure("sqlite_extra_cpu_ms", "sqlite's extra server CPU per rollout (same run)", "ms")
    own = {
        name: _figure(
            f"registry_{name}_cpu_ms", f"the registry's CPU per rollout in-process (admit + finish), {name}", "ms", 3
        )
        for name in ("memory", "sqlite")
    }
    modal_admit = _figure("modal_admit_ms", "admission on the modal-dict double, 20 ms calls (wall)", "ms", 0)
    modal_finish = _figure("modal_finish_ms", "the end on the modal-dict double, 20 ms calls (wall)", "ms", 0)
    abort = _figure("abort_ms", "abort from another process until the rollout's POST answered (sqlite)", "ms", 0)
    abort.label += f" ({ABORTS} per repetition)"
    beat = _figure("heartbeat_bytes", "one heartbeat of a process holding 64 runs", "bytes", 0)
    beat.values.append(anyio.run(_heartbeat_bytes, 64))
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as temporary:
        shared = f"sqlite:{Path(temporary) / 'state.db'}"
        with (
            fake_model() as model,
            app_server(state_backend="memory") as on_memory,
            app_server(state_backend=shared) as on_sqlite,
            app_server(state_backend=shared) as other,
        ):
            anyio.run(_server_cpu_ms, [on_memory, on_sqlite], model.url, 2)  # warm-up
            for repetition in range(repetitions):
                memory_ms, sqlite_ms = anyio.run(_server_cpu_ms, [on_memory, on_sqlite], model.url, rollouts)
                memory_cpu.values.append(memory_ms)
                sqlite_cpu.values.append(sqlite_ms)
                extra.values.append(sqlite_ms - memory_ms)
                own["memory"].values.append(anyio.run(_registry_cpu_ms, MemoryStore(), rollouts * 10))
                registry_db = Path(temporary) / f"registry-{repetition}.db"
                own["sqlite"].values.append(anyio.run(_registry_cpu_on_sqlite, registry_db, rollouts * 10))
                admit_ms, finish_ms = anyio.run(_modal_wall_ms, 5)
                modal_admit.values.append(admit_ms)
                modal_finish.values.append(finish_ms)
                abort.values += [anyio.run(_abort_ms, on_sqlite, other, model.url) for _ in range(ABORTS)]
    return [*calls, memory_cpu, sqlite_cpu, extra, *own.values(), modal_admit, modal_finish, abort, beat]
