"""Clients that misbehave, end to end: they hang up mid-rollout, send one run_id twice at once, abort,
and arrive twice as many as the concurrency cap at once.

What a rollout leaves behind is counted, not assumed: the server's asyncio tasks (`/health`'s
`runtime.tasks`), its registry's active runs, and the crafter worlds (`GameEnv`), games and engines
of the rollout, which must be garbage once it is cancelled (weak references; the server runs in this
process, so its objects are visible to `gc`).

(Already covered in `test_http_rollout.py`: a second POST of a running run_id is 409, a finished one
replays; abort stops a rollout within 2.5 s; a closed socket or a client read timeout aborts the run;
the cap answers 429 with Retry-After.)
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import httpx
import pytest
from support.errors import error_body
from support.fake_model import HANG_LIMIT_S, Behaviour, Exchange, FakeModel, error, tool_call
from support.polling import wait_until
from support.rollouts import request_body
from support.servers import AppServer, open_rollout

from task_app.core.contracts import RolloutResponse
from task_app.game import GameEnv
from task_app.game.episode import Game
from task_app.rollout.engine import RolloutEngine

pytestmark = [pytest.mark.usefixtures("no_key_in_logs"), pytest.mark.e2e]

WAIT_S = 10.0
SEED = 7  # one seed for every rollout here: after the first, its world comes from the cache


def held(gate: threading.Event, seen: dict[str, int]) -> Behaviour:
    """Answer a `noop` call once `gate` is set; count the requests whose client hung up first."""

    async def respond(ex: Exchange) -> None:
        with anyio.move_on_after(HANG_LIMIT_S):
            while not gate.is_set() and not ex.stopping.is_set():
                with anyio.move_on_after(0.01):
                    if (await ex.receive())["type"] == "http.disconnect":
                        seen["disconnected"] = seen.get("disconnected", 0) + 1
                        return
        await tool_call("noop")(ex)

    return respond


TRACKED = (RolloutEngine, Game, GameEnv)


def live() -> dict[type, list[Any]]:
    """The engines, games and worlds alive now (one full collection and one pass over the heap)."""
    gc.collect()
    found: dict[type, list[Any]] = {kind: [] for kind in TRACKED}
    for obj in gc.get_objects():
        for kind in TRACKED:
            if isinstance(obj, kind):
                found[kind].append(obj)
    return found


def tasks(server: AppServer) -> int:
    count: int = server.health()["runtime"]["tasks"]
    return count


def settle(server: AppServer, baseline: int) -> None:
    """Wait until the server is back to `baseline` tasks (a finishing response may take a moment)."""
    wait_until(lambda: tasks(server) <= baseline)
    assert tasks(server) == baseline


@pytest.fixture(scope="module")
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=32, thread_name_prefix="client-faults") as executor:
        yield executor


@pytest.fixture(scope="module", autouse=True)
def warm_world(app_server: AppServer) -> None:
    """Generate SEED's world once, so the timing tests below restore it from the cache."""
    scripted = request_body(decisions=1, env={"seed": SEED})
    assert app_server.client().post("/rollout", json=scripted).status_code == 200


# --- a client that hangs up -------------------------------------------------------------------------


def new_objects(before: dict[type, list[Any]]) -> list[weakref.ref[Any]]:
    """Weak references to the engines, games and worlds alive now that were not alive `before`."""
    now = live()
    return [
        weakref.ref(obj) for kind in TRACKED for obj in now[kind] if not any(obj is known for known in before[kind])
    ]


@pytest.mark.parametrize("clients", [1, 6], ids=["one", "six-at-once"])
def test_a_disconnect_cancels_the_rollout_and_frees_everything(
    app_server: AppServer, client: httpx.Client, fake_model: FakeModel, clients: int
) -> None:
    gate, seen = threading.Event(), {}
    fake_model.default = held(gate, seen)
    baseline_tasks = tasks(app_server)
    before = live()

    bodies = [request_body(inference_url=fake_model.url(), decisions=4, env={"seed": SEED}) for _ in range(clients)]
    sockets = [open_rollout(app_server.base_url, body, timeout=WAIT_S) for body in bodies]
    try:
        wait_until(lambda: len(fake_model.requests) == clients)  # every rollout is waiting for its model
        assert app_server.health()["rollouts"]["active"] == clients
        assert tasks(app_server) > baseline_tasks
        created = new_objects(before)
        assert len(created) == 3 * clients  # one engine, one game and one world per rollout
    finally:
        for sock in sockets:
            sock.close()

    for body in bodies:
        wait_until(lambda body=body: client.get(f"/run/status/{body['run_id']}").json()["status"] != "running")
        assert client.get(f"/run/status/{body['run_id']}").json()["status"] == "aborted"
    wait_until(lambda: seen.get("disconnected", 0) == clients)  # the model calls were hung up on too
    assert app_server.health()["rollouts"]["active"] == 0
    settle(app_server, baseline_tasks)
    gc.collect()
    assert [ref() for ref in created if ref() is not None] == []
    assert {kind: len(objects) for kind, objects in live().items()} == {kind: len(old) for kind, old in before.items()}
    gate.set()


# --- one run_id twice at once -----------------------------------------------------------------------


def test_the_same_run_id_sent_eight_times_at_once_runs_once(
    app_server: AppServer, client: httpx.Client, fake_model: FakeModel, pool: ThreadPoolExecutor
) -> None:
    gate, seen = threading.Event(), {}
    fake_model.default = held(gate, seen)
    body = request_body(inference_url=fake_model.url(), decisions=2, env={"seed": SEED})
    clients = [app_server.client(timeout=WAIT_S) for _ in range(8)]
    for each in clients:
        each.get("/health")  # connected before the race
    barrier = threading.Barrier(len(clients))

    def post(each: httpx.Client) -> httpx.Response:
        barrier.wait()
        return each.post("/rollout", json=body)

    futures = [pool.submit(post, each) for each in clients]
    try:
        wait_until(lambda: sum(future.done() for future in futures) == len(clients) - 1)
        refused = [future.result() for future in futures if future.done()]
        for response in refused:
            error_body(response, 409, "run_in_progress")
        assert app_server.health()["rollouts"]["active"] == 1
    finally:
        gate.set()
    (admitted,) = [future.result(timeout=WAIT_S) for future in futures if future.result() not in refused]
    assert admitted.status_code == 200
    assert RolloutResponse.model_validate(admitted.json()).metrics.num_steps == 2
    assert len(fake_model.requests) == 2  # one rollout ran, not eight
    assert client.post("/rollout", json=body).content == admitted.content  # and it now replays


# --- abort -------------------------------------------------------------------------------------------


def test_abort_during_a_retry_backoff_is_prompt(
    make_app_server: Callable[..., AppServer], fake_model: FakeModel, pool: ThreadPoolExecutor
) -> None:
    """The model said Retry-After: 20 (honoured up to 30 s here); abort ends the wait at once."""
    server = make_app_server(inference_backoff_max_s=30.0, warm_up=False)
    fake_model.default = error(429, retry_after="20")
    body = request_body(inference_url=fake_model.url(), decisions=2, env={"seed": SEED})
    running = pool.submit(server.client(timeout=WAIT_S).post, "/rollout", json=body)
    wait_until(lambda: len(fake_model.requests) == 1)
    time.sleep(0.05)  # let the rollout enter its 20 s backoff sleep (not a wait for a result)
    aborted_at = time.monotonic()
    assert server.client().post("/run/abort", json={"run_id": body["run_id"]}).status_code == 200
    response = running.result(timeout=WAIT_S)
    # Not waited out: a quarter of the backoff, however loaded the machine (the answer takes milliseconds).
    assert time.monotonic() - aborted_at < 5.0
    result = response.json()
    assert result["aborted"] is True and result["metrics"]["details"]["stop_reason"] == "aborted"
    assert len(fake_model.requests) == 1  # no retry after the abort
    assert server.health()["rollouts"]["active"] == 0


def test_aborting_every_running_rollout_at_once(
    make_app_server: Callable[..., AppServer], fake_model: FakeModel, pool: ThreadPoolExecutor
) -> None:
    server = make_app_server(warm_up=False)
    gate, seen = threading.Event(), {}
    fake_model.default = held(gate, seen)
    baseline_tasks = tasks(server)
    bodies = [request_body(inference_url=fake_model.url(), decisions=3, env={"seed": SEED}) for _ in range(8)]
    running = [pool.submit(server.client(timeout=WAIT_S).post, "/rollout", json=body) for body in bodies]
    try:
        wait_until(lambda: len(fake_model.requests) == len(bodies))
        aborters = [server.client() for _ in bodies]
        aborts = [
            pool.submit(each.post, "/run/abort", json={"run_id": body["run_id"]})
            for each, body in zip(aborters, bodies, strict=True)
        ]
        assert all(future.result(timeout=WAIT_S).status_code == 200 for future in aborts)
        results = [future.result(timeout=WAIT_S).json() for future in running]
    finally:
        gate.set()
    assert all(result["metrics"]["details"]["stop_reason"] == "aborted" for result in results)
    assert seen.get("disconnected", 0) == len(bodies)  # every model call was cancelled
    assert server.health()["rollouts"]["active"] == 0
    settle(server, baseline_tasks)


# --- twice the concurrency cap at once ---------------------------------------------------------------

CAP = 8


def test_twice_the_cap_at_once_the_excess_is_refused_before_any_work(
    make_app_server: Callable[..., AppServer], fake_model: FakeModel, pool: ThreadPoolExecutor
) -> None:
    """Sixteen requests at once against a cap of eight. The eight refusals are all answered while every
    admitted rollout still waits for its model, so a refusal never waits for a slot; and they cost
    nothing a rollout costs: no world restored, no model called. Counted, not timed: on a loaded
    2-core machine a refusal's wall time is the scheduler's, not the server's."""
    server = make_app_server(max_concurrent_rollouts=CAP, warm_up=False)
    gate, seen = threading.Event(), {}
    assert server.client().post("/rollout", json=request_body(decisions=1, env={"seed": SEED})).status_code == 200
    fake_model.default = held(gate, seen)
    baseline_tasks = tasks(server)
    worlds_before = server.health()["world_cache"]
    bodies = [request_body(inference_url=fake_model.url(), decisions=2, env={"seed": SEED}) for _ in range(2 * CAP)]
    clients = [server.client(timeout=WAIT_S) for _ in bodies]
    for each in clients:
        each.get("/health")  # connections open before the burst
    barrier = threading.Barrier(len(bodies))

    def post(each: httpx.Client, body: dict[str, Any]) -> httpx.Response:
        barrier.wait()
        return each.post("/rollout", json=body)

    futures = [pool.submit(post, each, body) for each, body in zip(clients, bodies, strict=True)]
    try:
        wait_until(lambda: sum(future.done() for future in futures) == CAP)
        wait_until(lambda: len(fake_model.requests) == CAP)  # every admitted rollout waits for its first answer
        refused = [future.result() for future in futures if future.done()]
        assert server.health()["rollouts"] == {"active": CAP, "limit": CAP, "queued": 0, "paced": 0}
        worlds = server.health()["world_cache"]
        assert (worlds["hits"], worlds["misses"]) == (worlds_before["hits"] + CAP, worlds_before["misses"])
    finally:
        gate.set()
    for response in refused:
        error_body(response, 429, "capacity_exceeded")
        assert int(response.headers["Retry-After"]) >= 1
    admitted = [future.result(timeout=WAIT_S) for future in futures if future.result() not in refused]
    assert len(admitted) == CAP
    for response in admitted:
        result = RolloutResponse.model_validate(response.json())
        assert result.aborted is False and result.metrics.num_steps == 2
    assert len(fake_model.requests) == 2 * CAP  # two decisions each, for the admitted only
    assert server.health()["rollouts"]["active"] == 0
    settle(server, baseline_tasks)
