"""EnvSessions in one test process: rebuilds identical to the live env, two "containers" stepping one env
(modal-dict double, with latency) without forking it, expiry, every cap, the reaper. The same over
real servers and processes: test_env_routes.py, test_env_fleet.py."""

from __future__ import annotations

import gc
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.fakes import FakeClock, FakeModalDict
from support.worlds import RecordedWorlds, game_state

from task_app.core.errors import Conflict, Gone, InvalidRequest, NotFound, RateLimited
from task_app.core.settings import Settings
from task_app.core.tasks import EVAL_FIRST_SEED, Tasks
from task_app.game import ACTIONS, Game, WorldFactory
from task_app.sessions import EnvSessions, EnvSpec, SessionLimits
from task_app.sessions.openenv import WsConnection
from task_app.sessions.openenv_mcp import Door
from task_app.sessions.records import log_key
from task_app.sessions.tools import KEY_SCOPE, ToolSessions
from task_app.store import StateStore
from task_app.store.memory import MemoryStore
from task_app.store.modal_dict import ModalDictStore
from task_app.store.sqlite import SqliteStore

pytestmark = pytest.mark.anyio

SPEC = EnvSpec("crafter", 11, (64, 64), 10_000, None, "test")


def call(*actions: str) -> list[dict[str, Any]]:
    return [{"tool": "interact_many", "args": {"actions": list(actions)}}]


def moves(seed: int, count: int) -> list[list[dict[str, Any]]]:
    rng = random.Random(seed)
    return [call(*(rng.choice(ACTIONS) for _ in range(rng.randint(1, 3)))) for _ in range(count)]


def live_game(manager: EnvSessions, env_id: str) -> Game:
    live = manager.live.get(env_id)
    assert live is not None
    return live.game


def sessions(store: StateStore, worlds: WorldFactory, **limits: Any) -> EnvSessions:
    return EnvSessions(store, worlds, SessionLimits(**{"checkpoint_every": 10, "rate_per_s": 1e6, **limits}))


async def test_a_rebuilt_env_is_the_live_env(worlds: WorldFactory, tmp_path: Path) -> None:
    store = await SqliteStore(tmp_path / "state.db").open()
    try:
        live = sessions(store, worlds)
        env_id = (await live.create(SPEC)).env_id
        for tool_calls in moves(1, 137):
            view = await live.step(env_id, tool_calls)
            if view.done:
                await live.reset(env_id, None)
        cached = live.live.get(env_id)
        fresh = sessions(store, worlds)  # another process: nothing live
        state = await fresh.state(env_id)
        rebuilt = fresh.live.get(env_id)
        assert cached is not None and rebuilt is not None
        assert game_state(rebuilt.game) == game_state(cached.game)
        assert (rebuilt.head, rebuilt.episode) == (cached.head, cached.episode)
        assert state.observation.text == (await live.state(env_id)).observation.text
        assert fresh.counters["rebuilds"] == 1
        assert fresh.counters["replayed"] <= 10  # from the latest checkpoint, at most K entries
    finally:
        await store.close()


async def test_two_containers_stepping_one_env_never_fork_it(worlds: WorldFactory) -> None:
    """Both hammer the same env at once through a modal.Dict double with 5 ms calls: every step lands
    at its own log index, and both end on the state a replay of the log gives."""
    fake = FakeModalDict(latency_s=0.005)
    first, second = sessions(ModalDictStore(fake), worlds), sessions(ModalDictStore(fake), worlds)
    env_id = (await first.create(SPEC)).env_id
    step_counts: list[int] = []

    async def stepper(manager: EnvSessions) -> None:
        for _ in range(20):
            step_counts.append((await manager.step(env_id, call("noop"))).step_idx)

    async with anyio.create_task_group() as group:
        group.start_soon(stepper, first)
        group.start_soon(stepper, second)
    assert sorted(step_counts) == list(range(1, 41))  # 40 steps, each answered from its own position
    assert first.counters["conflicts"] + second.counters["conflicts"] > 0  # they did collide
    await first.state(env_id)
    await second.state(env_id)
    replayed = sessions(ModalDictStore(fake), worlds)
    await replayed.state(env_id)
    states = [game_state(live_game(manager, env_id)) for manager in (first, second, replayed)]
    assert states[0] == states[1] == states[2]
    assert fake.get(log_key(env_id, 40)) is None and fake.get(log_key(env_id, 39)) is not None


async def test_alternating_processes_give_the_trajectory_of_one(worlds: WorldFactory) -> None:
    store = MemoryStore()
    one, other = sessions(store, worlds), sessions(store, worlds)
    alone = sessions(MemoryStore(), worlds)
    shared_id, alone_id = (await one.create(SPEC)).env_id, (await alone.create(SPEC)).env_id
    for index, tool_calls in enumerate(moves(2, 60)):
        a = await (one if index % 2 else other).step(shared_id, tool_calls)
        b = await alone.step(alone_id, tool_calls)
        assert (a.observation.text, a.observation.data, a.reward, a.done) == (
            b.observation.text,
            b.observation.data,
            b.reward,
            b.done,
        )


async def test_idle_envs_expire_and_free_their_slot(worlds: WorldFactory) -> None:
    clock = FakeClock()
    manager = sessions(MemoryStore(clock), worlds, ttl_s=100, max_envs=1)
    env_id = (await manager.create(SPEC)).env_id
    clock.now += 50
    await manager.step(env_id, call("noop"))  # refreshes the slot (more than 10 % of the TTL passed)
    clock.now += 95
    await manager.step(env_id, call("noop"))  # 95 s idle: still alive
    clock.now += 101
    with pytest.raises(Gone) as expired:
        await manager.step(env_id, call("noop"))
    assert expired.value.code == "env_expired"
    with pytest.raises(Gone):
        await sessions(manager.store, worlds, ttl_s=100).state(env_id)  # from any process
    await manager.create(SPEC)  # the slot is free again


@pytest.mark.parametrize("env_id", ["", "short", "has/slash-and-more-characters", "x" * 65, "A" * 22])
async def test_ids_that_name_nothing_are_not_found(worlds: WorldFactory, env_id: str) -> None:
    manager = sessions(MemoryStore(), worlds)
    with pytest.raises(NotFound) as missing:
        await manager.step(env_id, call("noop"))
    assert missing.value.code == "env_not_found"
    with pytest.raises(NotFound) as no_snapshot:
        await manager.restore(env_id)
    assert no_snapshot.value.code == "snapshot_not_found"


async def test_the_store_cap_and_the_step_cap(worlds: WorldFactory) -> None:
    manager = sessions(MemoryStore(), worlds, max_envs=2, max_steps=3)
    first = (await manager.create(SPEC)).env_id
    await manager.create(SPEC)
    with pytest.raises(RateLimited) as full:
        await manager.create(SPEC)
    assert (full.value.code, full.value.retry_after_s) == ("too_many_envs", 5)
    await manager.terminate(first)
    third = (await manager.create(SPEC)).env_id
    for _ in range(2):
        await manager.step(third, call("noop"))
    await manager.reset(third, 4)  # resets count: they are log entries too
    with pytest.raises(Conflict) as limit:
        await manager.step(third, call("noop"))
    assert limit.value.code == "env_step_limit"


async def test_snapshots_per_env_are_capped_until_the_oldest_expires(worlds: WorldFactory) -> None:
    clock = FakeClock()
    manager = sessions(MemoryStore(clock), worlds, max_snapshots=2, ttl_s=100)
    env_id = (await manager.create(SPEC)).env_id
    await manager.snapshot(env_id)
    clock.now += 30
    await manager.snapshot(env_id)
    with pytest.raises(RateLimited) as full:
        await manager.snapshot(env_id)
    assert full.value.code == "too_many_snapshots"
    assert full.value.retry_after_s == 70  # when the first snapshot expires
    clock.now += 71
    await manager.step(env_id, call("noop"))
    await manager.snapshot(env_id)


async def test_requests_per_env_are_rate_limited(worlds: WorldFactory) -> None:
    now = [0.0]
    manager = EnvSessions(MemoryStore(), worlds, SessionLimits(rate_per_s=2), monotonic=lambda: now[0])
    env_id = (await manager.create(SPEC)).env_id
    await manager.step(env_id, call("noop"))
    await manager.step(env_id, call("noop"))
    with pytest.raises(RateLimited) as limited:
        await manager.step(env_id, call("noop"))
    assert (limited.value.code, limited.value.retry_after_s) == ("env_rate_limited", 1)
    now[0] += 0.5
    await manager.step(env_id, call("noop"))


async def test_live_envs_in_use_are_never_evicted(worlds: WorldFactory) -> None:
    release, entered, hold = anyio.Event(), anyio.Event(), [False]

    class SlowClaims(MemoryStore):
        async def put_if_absent(self, key: str, value: bytes, *, ttl_s: float | None = None) -> bool:
            if hold[0]:  # the step's claim of its log entry, while the step holds the env's lock
                hold[0] = False
                entered.set()
                await release.wait()
            return await super().put_if_absent(key, value, ttl_s=ttl_s)

    manager = EnvSessions(SlowClaims(), worlds, SessionLimits(max_live=1))
    env_id = (await manager.create(SPEC)).env_id
    hold[0] = True
    async with anyio.create_task_group() as group:
        group.start_soon(manager.step, env_id, call("noop"))
        await entered.wait()
        with pytest.raises(RateLimited) as busy:
            await manager.create(SPEC)
        assert busy.value.code == "too_many_live_envs"
        release.set()
    await manager.create(SPEC)  # idle now: evicted to make room
    assert (await manager.state(env_id)).step_idx == 1  # and rebuilt on demand


async def test_snapshots_restore_and_branches_are_independent(worlds: WorldFactory) -> None:
    manager = sessions(MemoryStore(), worlds)
    env_id = (await manager.create(SPEC)).env_id
    for tool_calls in moves(3, 25):
        await manager.step(env_id, tool_calls)
    snapshot = await manager.snapshot(env_id)
    children = (await manager.branch([env_id], 2))[env_id]
    restored = await manager.restore(snapshot.snapshot_id)
    assert len(children) == 2 and restored.env_id not in children
    await manager.step(children[0], call("move_left", "move_left", "do"))
    copies = [restored.env_id, children[1], env_id]
    texts = {(await manager.state(copy)).observation.text for copy in copies}
    assert len(texts) == 1  # untouched copies still equal the original
    assert (await manager.state(children[0])).observation.text not in texts
    with pytest.raises(InvalidRequest, match="at most"):
        await manager.branch([env_id], 65)


class ScanCountingStore(MemoryStore):
    """The memory store, counting its prefix scans (each one walks every key it holds)."""

    scans = 0

    async def scan(self, prefix: str) -> list[str]:
        self.scans += 1
        return await super().scan(prefix)


async def test_a_reaper_pass_scans_the_store_a_fixed_number_of_times(worlds: WorldFactory) -> None:
    clock = FakeClock()
    store = ScanCountingStore(clock)
    manager = sessions(store, worlds, ttl_s=100)
    ended = [(await manager.create(SPEC)).env_id for _ in range(6)]
    kept = (await manager.create(SPEC)).env_id
    for env_id in [*ended, kept]:
        await manager.step(env_id, call("noop"))
    for env_id in ended:
        await manager.terminate(env_id)
    clock.now += 11
    store.scans = 0
    await manager.maintain()
    assert store.scans == 2  # the envs' markers, then every env's keys: not one scan per ended env
    for env_id in ended:
        assert await store.scan(f"env/{env_id}/") == [f"env/{env_id}/meta"]
    assert await store.scan(f"env/{kept}/log/")  # a live env keeps its log
    assert (await manager.step(kept, call("noop"))).observation.text


async def test_the_reaper_retires_lapsed_envs_and_erases_ended_ones(worlds: WorldFactory) -> None:
    clock = FakeClock()
    store = MemoryStore(clock)
    manager = sessions(store, worlds, ttl_s=100)
    ended = (await manager.create(SPEC)).env_id
    lapsed = (await manager.create(SPEC)).env_id
    for _ in range(12):
        await manager.step(ended, call("noop"))
    await manager.terminate(ended)
    assert await store.scan(f"env/{ended}/log/")  # kept a while: a stale process must find its claim taken
    clock.now += 11
    done = await manager.maintain()
    assert done["reaped"] == 0
    assert await store.scan(f"env/{ended}/") == [f"env/{ended}/meta"]  # erased but the tombstone
    clock.now += 100
    done = await manager.maintain()
    assert done["reaped"] == 1  # `lapsed`'s slot expired
    with pytest.raises(Gone):
        await sessions(store, worlds, ttl_s=100).state(lapsed)
    clock.now += 11
    await manager.maintain()
    assert await store.scan(f"env/{lapsed}/") == [f"env/{lapsed}/meta"]
    clock.now += 100
    await store.purge()
    assert len(store) == 0  # tombstones expire too: nothing is left


async def inline(fn: Callable[[], Any]) -> Any:
    """The offload without a thread: anyio's hand-off keeps the job's result in a future whose
    reference cycle the next young collection frees; what is checked here is the worlds' own cycles."""
    return fn()


async def test_replaced_and_evicted_worlds_are_freed_without_the_cycle_collector(worlds: WorldFactory) -> None:
    """crafter's objects and world refer to each other: a world an env session is done with (replaced by
    a reset, or its env evicted from memory) is closed, so its memory returns at once."""
    recorded, now = RecordedWorlds(worlds), [0.0]
    limits = SessionLimits(max_live=1, rate_per_s=1e6)
    manager = EnvSessions(MemoryStore(), recorded, limits, inline, lambda: now[0])  # type: ignore[arg-type]
    gc.disable()
    try:
        first = (await manager.create(SPEC)).env_id
        await manager.reset(first, None)
        await manager.reset(first, 12)
        await manager.create(SPEC)  # the first env evicted to make room
        now[0] += limits.ttl_s + 1
        assert (await manager.maintain())["evicted"] == 1  # the second, idle
        assert len(recorded.made) == 4
        assert [ref() for ref in recorded.made] == [None] * 4
    finally:
        gc.enable()


async def test_an_openenv_session_frees_its_worlds_without_the_cycle_collector(worlds: WorldFactory) -> None:
    recorded = RecordedWorlds(worlds)
    tools = tool_sessions(MemoryStore(), worlds)
    session = WsConnection(SPEC, Door(KEY_SCOPE), tools, recorded, inline)  # type: ignore[arg-type]
    gc.disable()
    try:
        for seed in (3, 4):
            answer, _ = await session.handle(json.dumps({"type": "reset", "data": {"seed": seed}}))
            assert answer is not None and answer["type"] == "observation"
        assert recorded.made[0]() is None  # replaced by the second reset
        await session.close()  # the connection ended
        assert len(recorded.made) == 2 and recorded.made[1]() is None
    finally:
        gc.enable()


# --- the tool layer the standard doors share -------------------------------------------------------------


def tool_sessions(store: StateStore, worlds: WorldFactory) -> ToolSessions:
    settings = Settings(sessions_checkpoint_every=10, sessions_rate_per_s=1e6)
    return ToolSessions(
        EnvSessions(store, worlds, SessionLimits.from_settings(settings), tasks=Tasks(settings)), settings
    )


async def test_tools_play_an_episode_to_done_across_processes(worlds: WorldFactory, tmp_path: Path) -> None:
    store = await SqliteStore(tmp_path / "state.db").open()
    try:
        first, second = tool_sessions(store, worlds), tool_sessions(store, worlds)  # two containers, one store
        names = [tool["name"] for tool in first.tool_list()]
        assert names == ["start", "interact_many", "observe", "snapshot", "restore"]
        interact = first.tool_list()[1]["inputSchema"]
        assert interact["required"] == ["actions"] and interact["properties"]["actions"]["maxItems"] == 8
        session_id, view = await first.open("key", task_id="crafter/eval/3", config={"length": 12})
        assert (view.task_id, view.seed) == ("crafter/eval/3", EVAL_FIRST_SEED + 3)
        result = await first.call("key", session_id, "interact_many", {"actions": ["move_left", "dance"]})
        assert result.data["actions"] == ["move_left"] and result.data["rejected"][0]["item"] == "dance"
        assert "Rejected: dance" in result.text and result.data["step_count"] == 1
        saved = await second.call("key", session_id, "snapshot", {})  # the other process serves the session
        at_snapshot = saved.data["step_idx"]
        assert (await second.call("key", session_id, "interact_many", {"actions": ["noop"] * 3})).data[
            "step_count"
        ] == 2
        restored = await first.call("key", session_id, "restore", {"snapshot_id": saved.data["snapshot_id"]})
        assert restored.data["step_idx"] == at_snapshot and restored.data["env_id"] != saved.data["env_id"]
        steps = 0
        while not result.done:
            result = await (first, second)[steps % 2].call(
                "key", session_id, "interact_many", {"actions": ["noop"] * 4}
            )
            steps += 1
        assert result.done and result.data["truncated"] and "The episode is over" in result.text
        over = await first.call("key", session_id, "interact_many", {"actions": ["noop"]})
        assert over.data["episode_over"] and over.reward == 0
        started = await second.call("key", session_id, "start", {"task_id": "crafter/train/5"})
        assert (started.data["seed"], started.data["episode"], started.done) == (5, 2, False)
        assert started.mcp()["data"]["task_id"] == "crafter/train/5"
        assert started.mcp()["content"][0]["text"].startswith("Episode 2 started: crafter/train/5.")
        with pytest.raises(NotFound):
            await first.call("token:other", session_id, "observe", {})  # another scope's session
        with pytest.raises(InvalidRequest) as bad:
            await first.call("key", session_id, "fly", {})
        assert bad.value.code == "unknown_tool"
        for arguments in ({"actions": []}, {"actions": "noop"}, {"actions": ["noop"], "x": 1}, None):
            with pytest.raises(InvalidRequest) as bad:
                await first.call("key", session_id, "interact_many", arguments)
            assert bad.value.code == "invalid_tool_arguments"
        with pytest.raises(InvalidRequest) as bad:
            await first.call("key", session_id, "start", {"task_id": "crafter/eval/3", "seed": 3})
        assert bad.value.code == "task_seed_mismatch"
        await second.close("key", session_id)
        with pytest.raises(NotFound):
            await first.call("key", session_id, "observe", {})
    finally:
        await store.close()
