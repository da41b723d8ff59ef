"""B6 env sessions: what a trainer running its own agent loop pays per step, and what the record costs.

    /step        server CPU (the app process's own counters) and latency per /step, 1 action each, at
                 1 client and at 64 clients (each stepping its own env), on the memory and the sqlite
                 backend: what the store's one write per step adds
    rebuild      a process that does not hold an env rebuilds it from the sqlite store: latest
                 checkpoint + at most K log entries; after 100, 1,000 and 10,000 logged steps, against
                 replaying the whole log (checkpoints off); and on the modal-dict double with 20 ms
                 calls (a simulation of Modal's round trips: there is no Modal account here)
    doors        the same step through the MCP door (`/mcp`, tools/call of interact_many) and the ORS door
                 (`/call` on the ORS port), 1 client: server CPU and latency per step, and their ratio to
                 /step's in the same server (memory backend)
    WebSocket    OpenEnv steps per second over one connection, and over 8 at once
    memory       RSS per live env in the server (200 envs created and stepped)
    store bytes  per env (after create and after 100 steps), per log entry, per snapshot (keys included)
    peer         the same WebSocket (8 connections) and HTTP /step phases against crafter served by OpenEnv's
                 own server (benchmarks/peer_openenv.py, run by `OPENENV_PYTHON`), beside the app's in one
                 run; skipped, with the reason printed, when that interpreter cannot import openenv

Server-side figures come from an app server process (benchmarks/app_server.py); the rebuild and the
bytes are measured in this process on the same store classes the server uses.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import orjson
from websockets.asyncio.client import connect

from task_app.core.stats import percentile
from task_app.game import ActionPlan, Game, WorldFactory, warm_up
from task_app.sessions import EnvSessions, EnvSpec, SessionLimits
from task_app.sessions.records import env_prefix, log_key, marker_key, slot_key
from task_app.store import StateStore
from task_app.store.modal_dict import ModalDictStore
from task_app.store.sqlite import SqliteStore

from .client import HEADERS
from .processes import Served, app_server, peer_server
from .report import Figure

BENCH = "B6"
ROOT = Path(__file__).resolve().parent.parent
MB = 1024 * 1024
SPEC = EnvSpec("crafter", 3, (64, 64), 10_000, None, "bench")
NOOP = [{"tool": "interact", "args": {"action": "noop"}}]
STEP = [{"tool": "interact_many", "args": {"actions": ["move_left"]}}]


def _figure(name: str, label: str, unit: str, **kwargs: Any) -> Figure:
    return Figure(BENCH, name, label, unit, **kwargs)


def _session(concurrency: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        headers=HEADERS,
        connector=aiohttp.TCPConnector(limit=concurrency + 8),
        timeout=aiohttp.ClientTimeout(total=120),
        trust_env=False,
    )


async def _post(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> dict[str, Any]:
    async with http.post(url, json=body, headers=headers) as response:
        data: dict[str, Any] = orjson.loads(await response.read())
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}: {data}")
        return data


async def _steps(app: Served, clients: int, steps: int) -> tuple[list[float], float]:
    """`clients` concurrent loops, each creating its own env and stepping it `steps` times; the latency
    of every /step (seconds) and the server CPU seconds they cost."""
    latencies: list[float] = []
    async with _session(clients) as http:
        envs = [
            (await _post(http, app.url + "/create", {"env_name": "crafter", "seed": index}))["env_id"]
            for index in range(clients)
        ]
        for env_id in envs:  # warm: each env live, its world generated
            await _post(http, app.url + "/step", {"env_id": env_id, "tool_calls": NOOP})

        async def loop(env_id: str) -> None:
            for index in range(steps):
                started = time.perf_counter()
                body = await _post(
                    http, app.url + "/step", {"env_id": env_id, "tool_calls": STEP if index % 2 else NOOP}
                )
                latencies.append(time.perf_counter() - started)
                if body["done"]:
                    await _post(http, app.url + "/reset", {"env_id": env_id})

        cpu = app.cpu_s()
        async with anyio.create_task_group() as group:
            for env_id in envs:
                group.start_soon(loop, env_id)
        return latencies, app.cpu_s() - cpu


def _floor_ms(worlds: WorldFactory, steps: int) -> float:
    """CPU of the same work without the service: crafter's step, the observation, the answer's JSON."""
    game = Game(worlds.world(0))
    started = time.process_time()
    for index in range(steps):
        plan = ActionPlan(("move_left",) if index % 2 else ("noop",))
        outcome, observation = game.step(plan)
        orjson.dumps({"observation": {**observation.data, "text": observation.text}, "reward": outcome.reward})
        if game.done:
            game = Game(worlds.world(0))
    return (time.process_time() - started) / steps * 1000


def _step_figures(repetitions: int, quick: bool) -> list[Figure]:
    worlds = WorldFactory(cache_size=16)
    warm_up(worlds)
    floor = _figure("floor", "floor: crafter step + observation + JSON, in-process", "ms")
    figures: list[Figure] = [floor]
    for backend in ("memory", "sqlite"):
        for clients, steps in ((1, 300 if quick else 1000), (64, 20 if quick else 60)):
            where = f"{clients} client{'s' if clients > 1 else ''}, {backend}"
            cpu_target = ("<=", 0.6) if backend == "sqlite" else None  # issue 35: <= 3x the floor
            cpu = _figure(f"cpu_{backend}_{clients}", f"/step server CPU, {where}", "ms", target=cpu_target)
            ratio = _figure(f"cpu_ratio_{backend}_{clients}", f"/step server CPU / floor, {where}", "x")
            p50 = _figure(f"p50_{backend}_{clients}", f"/step latency p50, {where}", "ms")
            p99_target = ("<=", 20.0) if clients == 64 else None
            p99 = _figure(f"p99_{backend}_{clients}", f"/step latency p99, {where}", "ms", target=p99_target)
            for _ in range(repetitions):
                with tempfile.TemporaryDirectory(prefix="bench-state-") as directory:
                    spec = "memory" if backend == "memory" else f"sqlite:{Path(directory) / 'state.db'}"
                    with app_server(state_backend=spec, tracing_enabled=False, sessions_max_live=256) as app:
                        latencies, cpu_s = anyio.run(_steps, app, clients, steps)
                floor.values.append(_floor_ms(worlds, 300))
                cpu.values.append(cpu_s / len(latencies) * 1000)
                ratio.values.append(cpu.values[-1] / floor.values[-1])
                p50.values.append(statistics.median(latencies) * 1000)
                p99.values.append(percentile(latencies, 99) * 1000)
            figures += [cpu, ratio, p50, p99]
    return figures


MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


async def _mcp_call(http: aiohttp.ClientSession, url: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
    result: dict[str, Any] = (await _post(http, url, body, MCP_HEADERS))["result"]
    if result.get("isError"):
        raise RuntimeError(f"MCP {name}: {result}")
    return result


async def _timed(steps: int, app: Served, one: Any) -> tuple[list[float], float]:
    """`await one(index)` `steps` times: each one's latency (s) and the server CPU seconds they cost."""
    latencies: list[float] = []
    cpu = app.cpu_s()
    for index in range(steps):
        started = time.perf_counter()
        await one(index)
        latencies.append(time.perf_counter() - started)
    return latencies, app.cpu_s() - cpu


async def _door_steps(app: Served, steps: int) -> dict[str, tuple[list[float], float]]:
    """1 client's steps through /step, MCP and ORS, one after another on the same server (an episode that
    ends starts again: reset, start, a new ORS session)."""
    found: dict[str, tuple[list[float], float]] = {}
    async with _session(1) as http:
        env_id = (await _post(http, app.url + "/create", {"env_name": "crafter", "seed": 1}))["env_id"]

        async def step(index: int) -> None:
            body = {"env_id": env_id, "tool_calls": STEP if index % 2 else NOOP}
            if (await _post(http, app.url + "/step", body))["done"]:
                await _post(http, app.url + "/reset", {"env_id": env_id})

        mcp = app.url + "/mcp"
        session_id = (await _mcp_call(http, mcp, "start", {"seed": 1}))["structuredContent"]["session_id"]

        async def mcp_step(index: int) -> None:
            actions = ["move_left"] if index % 2 else ["noop"]
            result = await _mcp_call(http, mcp, "interact_many", {"session_id": session_id, "actions": actions})
            if result["structuredContent"]["done"]:
                await _mcp_call(http, mcp, "start", {"session_id": session_id, "seed": 1})

        ors, ors_headers = f"http://127.0.0.1:{app.extra['ors_port']}", {}

        async def ors_session() -> None:
            async with http.post(ors + "/create_session") as response:
                ors_headers["X-Session-ID"] = (await response.text()).split("event: task_id\ndata: ")[1].split("\n")[0]
            await _post(http, ors + "/create", {"split": "train", "index": 1}, ors_headers)

        async def ors_step(index: int) -> None:
            body = {"name": "interact_many", "input": {"actions": ["move_left"] if index % 2 else ["noop"]}}
            async with http.post(ors + "/call", json=body, headers=ors_headers) as response:
                answer = orjson.loads((await response.text()).split("event: end\ndata: ")[1].split("\n")[0])
            if not answer["ok"]:
                raise RuntimeError(f"ORS /call: {answer}")
            if answer["output"]["finished"]:
                await _post(http, ors + "/delete", {}, ors_headers)
                await ors_session()

        await ors_session()
        for name, one in (("step", step), ("mcp", mcp_step), ("ors", ors_step)):
            await one(0)  # warm
            found[name] = await _timed(steps, app, one)
    return found


def _door_figures(repetitions: int, quick: bool) -> list[Figure]:
    doors = {"step": "/step", "mcp": "MCP tools/call", "ors": "ORS /call"}
    cpu = {name: _figure(f"door_cpu_{name}", f"{label} server CPU, 1 client", "ms") for name, label in doors.items()}
    p50 = {name: _figure(f"door_p50_{name}", f"{label} latency p50, 1 client", "ms") for name, label in doors.items()}
    ratios = {
        name: _figure(f"door_ratio_{name}", f"{doors[name]} server CPU / /step's", "x", target=("<=", 1.5))
        for name in ("mcp", "ors")
    }
    steps = 300 if quick else 1000
    for _ in range(repetitions):
        with app_server(tracing_enabled=False, sessions_rate_per_s=1e6, ors=True) as app:
            found = anyio.run(_door_steps, app, steps)
        for name, (latencies, cpu_s) in found.items():
            cpu[name].values.append(cpu_s / len(latencies) * 1000)
            p50[name].values.append(statistics.median(latencies) * 1000)
        for name, ratio in ratios.items():
            ratio.values.append(cpu[name].values[-1] / cpu["step"].values[-1])
    return [*cpu.values(), *p50.values(), *ratios.values()]


async def _grown(store: StateStore, worlds: WorldFactory, entries: int, checkpoint_every: int) -> str:
    """An env whose log holds `entries` entries (steps, and a reset after each episode's end)."""
    limits = SessionLimits(checkpoint_every=checkpoint_every, rate_per_s=1e9, max_steps=10**6)
    manager = EnvSessions(store, worlds, limits)
    env_id = (await manager.create(SPEC)).env_id
    while (live := manager.live.get(env_id)) is not None and live.head < entries:
        if (await manager.step(env_id, STEP if live.head % 2 else NOOP)).done:
            await manager.reset(env_id, None)
    return env_id


async def _rebuild_ms(store: StateStore, worlds: WorldFactory, env_id: str, checkpoint_every: int) -> float:
    fresh = EnvSessions(store, worlds, SessionLimits(checkpoint_every=checkpoint_every, max_steps=10**6))
    started = time.perf_counter()
    await fresh.state(env_id)
    return (time.perf_counter() - started) * 1000


async def _rebuild_on_sqlite(path: Path, worlds: WorldFactory, entries: int, checkpoint_every: int) -> float:
    store = await SqliteStore(path).open()
    try:
        env_id = await _grown(store, worlds, entries, checkpoint_every)
        return await _rebuild_ms(store, worlds, env_id, checkpoint_every)
    finally:
        await store.close()


def modal_dict_double() -> Any:
    """The tests' `FakeModalDict` (tests/support/fakes.py: modal.Dict's documented semantics, with latency)."""
    spec = importlib.util.spec_from_file_location("_test_fakes", ROOT / "tests" / "support" / "fakes.py")
    if spec is None or spec.loader is None:  # pragma: no cover - the file is in the repository
        raise RuntimeError("tests/support/fakes.py not found")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FakeModalDict


def _rebuild_figures(repetitions: int, quick: bool) -> list[Figure]:
    worlds = WorldFactory(cache_size=16)
    warm_up(worlds)
    sizes = (100, 1000) if quick else (100, 1000, 10_000)
    cases = [(f"checkpointed_{size}", f"rebuild after {size:,} steps (sqlite, K=50)", size, 50) for size in sizes]
    cases += [
        (f"replayed_{size}", f"rebuild after {size:,} steps, no checkpoints (replay all)", size, 10**9)
        for size in sizes
    ]
    figures = []
    for name, label, size, every in cases:
        figure = _figure(f"rebuild_{name}", label, "ms")
        for _ in range(repetitions):
            with tempfile.TemporaryDirectory(prefix="bench-rebuild-") as directory:
                figure.values.append(anyio.run(_rebuild_on_sqlite, Path(directory) / "state.db", worlds, size, every))
        figures.append(figure)
    modal = _figure("rebuild_modal_1000", "rebuild after 1,000 steps, modal-dict double with 20 ms calls", "ms")
    double = modal_dict_double()
    for _ in range(repetitions):

        async def on_modal() -> float:
            fake = double(latency_s=0.0)
            env_id = await _grown(ModalDictStore(fake), worlds, 1000, 50)
            fake.latency_s = 0.020
            return await _rebuild_ms(ModalDictStore(fake), worlds, env_id, 50)

        modal.values.append(anyio.run(on_modal))
    return [*figures, modal]


async def _websocket_steps(app: Served, connections: int, steps: int) -> tuple[float, float]:
    """Steps per second over `connections` of the app's OpenEnv WebSockets, and the server's CPU per step (ms)."""
    async with _session(1) as http:
        token = await _post(http, app.url + "/openenv/tokens", {})
    return await _ws_steps(app, token["base_url"].replace("http://", "ws://") + "/ws", connections, steps)


async def _live_env_bytes(app: Served, envs: int) -> float:
    async with _session(16) as http:
        before = app.rss_bytes()
        for index in range(envs):
            env_id = (await _post(http, app.url + "/create", {"env_name": "crafter", "seed": index % 8}))["env_id"]
            await _post(http, app.url + "/step", {"env_id": env_id, "tool_calls": STEP})
        return (app.rss_bytes() - before) / envs


def _server_figures(repetitions: int, quick: bool) -> list[Figure]:
    one = _figure("ws_steps_1", "WebSocket steps per second, 1 connection", "/s", digits=0)
    eight = _figure("ws_steps_8", "WebSocket steps per second, 8 connections", "/s", digits=0, target=(">=", 4000))
    ws_cpu = _figure("ws_cpu", "WebSocket step server CPU, 8 connections", "ms", target=("<=", 0.25))
    memory = _figure("live_env_mb", "RSS per live env (200 envs)", "MB", digits=3)
    steps = 300 if quick else 2000
    for _ in range(repetitions):
        with app_server(tracing_enabled=False, sessions_max_live=512, sessions_rate_per_s=1e6) as app:
            one.values.append(anyio.run(_websocket_steps, app, 1, steps)[0])
            rate, cpu = anyio.run(_websocket_steps, app, 8, steps // 4)
            eight.values.append(rate)
            ws_cpu.values.append(cpu)
            anyio.run(_live_env_bytes, app, 8)  # the 8 worlds generated before RSS is measured (B2 times that)
            memory.values.append(anyio.run(_live_env_bytes, app, 200) / MB)
    return [one, eight, ws_cpu, memory]


def peer_python() -> tuple[str, str | None]:
    """The interpreter that serves the peer (`OPENENV_PYTHON`, default this one), and why it cannot (or None)."""
    python = os.environ.get("OPENENV_PYTHON") or sys.executable
    check = [python, "-c", "import openenv.core.env_server"]
    try:
        done = subprocess.run(check, capture_output=True, text=True, timeout=120, check=False)
    except OSError as exc:
        return python, f"{python}: {exc}"
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return python, f"{python} cannot import openenv ({last})"
    return python, None


async def _http_steps(app: Served, url: str, body: dict[str, Any], steps: int) -> tuple[float, float]:
    """One client posting `body` to `url` `steps` times: steps per second and the server's CPU per step (ms)."""
    async with _session(1) as http:
        await _post(http, url, body)  # warm
        started, cpu = time.perf_counter(), app.cpu_s()
        for _ in range(steps):
            await _post(http, url, body)
        return steps / (time.perf_counter() - started), (app.cpu_s() - cpu) / steps * 1000


async def _ws_steps(app: Served, url: str, connections: int, steps: int) -> tuple[float, float]:
    """Steps per second over `connections` OpenEnv WebSockets at `url`, and the server's CPU per step (ms)."""

    async def one() -> None:
        async with connect(url, max_size=None) as socket:
            await socket.send(orjson.dumps({"type": "reset", "data": {"seed": 1}}).decode())
            await socket.recv()
            for index in range(steps):
                actions = ["move_left"] if index % 2 else ["noop"]
                await socket.send(orjson.dumps({"type": "step", "data": {"actions": actions}}).decode())
                reply = orjson.loads(await socket.recv())
                if reply["data"]["done"]:
                    await socket.send(orjson.dumps({"type": "reset", "data": {}}).decode())
                    await socket.recv()

    started, cpu = time.perf_counter(), app.cpu_s()
    await asyncio.gather(*(one() for _ in range(connections)))
    total = connections * steps
    return total / (time.perf_counter() - started), (app.cpu_s() - cpu) / total * 1000


async def _ours(app: Served, connections: int, steps: int) -> tuple[float, float, float, float]:
    async with _session(1) as http:
        token = await _post(http, app.url + "/openenv/tokens", {})
        env_id = (await _post(http, app.url + "/create", {"env_name": "crafter", "seed": 1}))["env_id"]
    ws = await _ws_steps(app, token["base_url"].replace("http://", "ws://") + "/ws", connections, steps)
    body = {"env_id": env_id, "tool_calls": NOOP}
    return (*ws, *await _http_steps(app, app.url + "/step", body, steps))


async def _theirs(peer: Served, connections: int, steps: int) -> tuple[float, float, float, float]:
    ws = await _ws_steps(peer, peer.url.replace("http://", "ws://") + "/ws", connections, steps)
    body = {"action": {"actions": ["noop"]}}
    return (*ws, *await _http_steps(peer, peer.url + "/step", body, steps))


def _peer_figures(repetitions: int, quick: bool) -> list[Figure]:
    python, missing = peer_python()
    if missing is not None:
        print(f"B6 peer skipped: {missing}; set OPENENV_PYTHON to a virtualenv with openenv (docs/performance.md)")
        return []
    names = ("ws_steps", "ws_cpu", "http_steps", "http_cpu")
    labels = (
        ("WebSocket steps per second, 8 connections", "/s", 0),
        ("WebSocket step server CPU, 8 connections", "ms", 2),
        ("HTTP step per second, 1 client", "/s", 0),
        ("HTTP step server CPU, 1 client", "ms", 2),
    )
    ours = [
        _figure(f"peer_ours_{name}", f"{label} (app)", unit, digits=digits)
        for name, (label, unit, digits) in zip(names, labels, strict=True)
    ]
    theirs = [
        _figure(f"peer_openenv_{name}", f"{label} (OpenEnv's server)", unit, digits=digits)
        for name, (label, unit, digits) in zip(names, labels, strict=True)
    ]
    ratios = [
        _figure("peer_ratio_ws_steps", "WebSocket steps/s: app / OpenEnv's server", "x", target=(">=", 2.0)),
        _figure("peer_ratio_http_steps", "HTTP steps/s: app / OpenEnv's server", "x", target=(">=", 2.0)),
    ]
    connections, steps = 8, 100 if quick else 500
    for _ in range(repetitions):
        with app_server(tracing_enabled=False, sessions_rate_per_s=1e6) as app:
            for figure, value in zip(ours, anyio.run(_ours, app, connections, steps), strict=True):
                figure.values.append(value)
        with peer_server(python) as peer:
            for figure, value in zip(theirs, anyio.run(_theirs, peer, connections, steps), strict=True):
                figure.values.append(value)
        ratios[0].values.append(ours[0].values[-1] / theirs[0].values[-1])
        ratios[1].values.append(ours[2].values[-1] / theirs[2].values[-1])
    return [*ours, *theirs, *ratios]


def _bytes_figures(quick: bool) -> list[Figure]:
    worlds = WorldFactory(cache_size=16)

    async def measure() -> tuple[int, int, int, int]:
        with tempfile.TemporaryDirectory(prefix="bench-bytes-") as directory:
            store = await SqliteStore(Path(directory) / "state.db").open()
            try:
                manager = EnvSessions(store, worlds, SessionLimits(rate_per_s=1e9))

                async def env_bytes(env_id: str) -> int:
                    live = manager.live.get(env_id)
                    slot = [slot_key(live.meta.slot)] if live is not None else []
                    keys = [*await store.scan(env_prefix(env_id)), marker_key(env_id), *slot]
                    values = await store.get_many(keys)
                    return sum(len(key) + len(value) for key, value in zip(keys, values, strict=True) if value)

                env_id = (await manager.create(SPEC)).env_id
                created = await env_bytes(env_id)
                for index in range(100):
                    await manager.step(env_id, STEP if index % 2 else NOOP)
                stepped = await env_bytes(env_id)
                snapshot = await manager.snapshot(env_id)
                entry = len(log_key(env_id, 0)) + len((await store.get(log_key(env_id, 0))) or b"")
                return created, stepped, snapshot.size, entry
            finally:
                await store.close()

    created, stepped, snapshot, entry = anyio.run(measure)
    return [
        _figure("bytes_env_created", "store bytes per env, just created", "KB", values=[created / 1024]),
        _figure("bytes_env_100", "store bytes per env after 100 steps (2 checkpoints)", "KB", values=[stepped / 1024]),
        _figure("bytes_log_entry", "store bytes per logged step", "B", values=[float(entry)], digits=0),
        _figure("bytes_snapshot", "store bytes per snapshot", "KB", values=[snapshot / 1024]),
    ]


def run(repetitions: int, quick: bool) -> list[Figure]:
    return [
        *_step_figures(repetitions, quick),
        *_door_figures(repetitions, quick),
        *_rebuild_figures(repetitions, quick),
        *_server_figures(repetitions, quick),
        *_bytes_figures(quick),
        *_peer_figures(repetitions, quick),
    ]
