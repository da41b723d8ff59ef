"""Env sessions across real app processes sharing `TASKAPP_STATE_BACKEND=sqlite:PATH`, as Modal's
containers share a modal.Dict: requests alternating between them, a process killed mid-episode, and
both stepping one env at once."""

from __future__ import annotations

import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.processes import ServerProcess, server_process, server_processes

from task_app.game import ACTIONS

pytestmark = [pytest.mark.usefixtures("no_key_in_logs"), pytest.mark.e2e]


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    backend = f"sqlite:{tmp_path / 'state.db'}"
    settings = [{"state_backend": backend, "traces_db": tmp_path / name} for name in ("a.db", "b.db")]
    with server_processes(tmp_path, *settings) as (first, second):
        yield first, second


def calls(seed: int, count: int) -> list[list[dict[str, Any]]]:
    rng = random.Random(seed)
    return [
        [{"tool": "interact_many", "args": {"actions": [rng.choice(ACTIONS) for _ in range(rng.randint(1, 3))]}}]
        for _ in range(count)
    ]


def answer_of(response: httpx.Response) -> tuple[Any, ...]:
    assert response.status_code == 200, response.text
    body = response.json()
    return body["observation"], body["reward"], body["done"], body["step_idx"]


def play(clients: list[httpx.Client], env_id: str, tool_calls: list[list[dict[str, Any]]]) -> list[tuple[Any, ...]]:
    """Step through the calls, each on the next client in turn; reset (on the next client) after an end."""
    seen, turn = [], 0
    for call in tool_calls:
        seen.append(answer_of(clients[turn % len(clients)].post("/step", json={"env_id": env_id, "tool_calls": call})))
        turn += 1
        if seen[-1][2]:
            clients[turn % len(clients)].post("/reset", json={"env_id": env_id})
            turn += 1
    return seen


def test_alternating_between_processes_gives_the_trajectory_of_one(pair: tuple[ServerProcess, ServerProcess]) -> None:
    first, second = pair
    with first.client() as a, second.client() as b:
        shared = a.post("/create", json={"env_name": "crafter", "seed": 21}).json()["env_id"]
        alone = a.post("/create", json={"env_name": "crafter", "seed": 21}).json()["env_id"]
        moves = calls(21, 120)
        alternating = play([a, b], shared, moves)
        one_process = play([a], alone, moves)
        assert alternating == one_process
        assert b.get("/health").json()["sessions"]["rebuilds"] >= 1  # b had to rebuild it from the store
        snapshot = b.post("/snapshot", json={"env_id": shared}).json()["snapshot_id"]
        restored = a.post("/restore", json={"snapshot_id": snapshot}).json()
        terminated = a.post("/terminate", json={"env_id": shared})
        assert terminated.json() == {"ok": True}
        assert b.post("/step", json={"env_id": shared, "tool_calls": []}).json()["error"]["code"] == "env_not_found"
        assert b.post("/step", json={"env_id": restored["env_id"], "tool_calls": []}).status_code == 200


def test_a_killed_process_loses_no_answered_step(tmp_path: Path) -> None:
    backend = f"sqlite:{tmp_path / 'state.db'}"
    moves = calls(5, 80)
    with server_process(tmp_path, state_backend=backend, traces_db=tmp_path / "b.db") as survivor:
        with server_process(tmp_path, state_backend=backend, traces_db=tmp_path / "a.db") as doomed:
            with doomed.client() as a:
                env_id = a.post("/create", json={"env_name": "crafter", "seed": 5}).json()["env_id"]
                before = play([a], env_id, moves[:50])
            doomed.kill()  # SIGKILL mid-episode: no shutdown, nothing flushed
        with survivor.client() as b:
            after = play([b], env_id, moves[50:])
    with server_process(tmp_path, traces_db=tmp_path / "c.db") as reference, reference.client() as c:
        reference_id = c.post("/create", json={"env_name": "crafter", "seed": 5}).json()["env_id"]
        assert before + after == play([c], reference_id, moves)


def test_two_processes_stepping_one_env_at_once_order_their_steps(pair: tuple[ServerProcess, ServerProcess]) -> None:
    first, second = pair
    with first.client() as a, second.client() as b:
        env_id = a.post("/create", json={"env_name": "crafter", "seed": 8}).json()["env_id"]
        noop = [{"tool": "interact", "args": {"action": "noop"}}]

        def hammer(client: httpx.Client) -> list[httpx.Response]:
            return [client.post("/step", json={"env_id": env_id, "tool_calls": noop}) for _ in range(30)]

        with ThreadPoolExecutor(4) as pool:
            responses = [r for batch in pool.map(hammer, [a, b, a, b]) for r in batch]
        answered = [response.json()["step_idx"] for response in responses if response.status_code == 200]
        busy = [response for response in responses if response.status_code != 200]
        assert all(response.status_code == 409 and response.json()["error"]["code"] == "env_busy" for response in busy)
        assert sorted(answered) == list(range(1, len(answered) + 1))  # one log position each: no fork
        assert len(answered) > len(busy)
        conflicts = [client.get("/health").json()["sessions"]["conflicts"] for client in (a, b)]
        assert sum(conflicts) > 0, conflicts  # they did race for the same log positions
        state = b.post("/snapshot", json={"env_id": env_id}).json()
        restored = a.post("/restore", json={"snapshot_id": state["snapshot_id"]}).json()
        assert restored["step_idx"] == len(answered)  # every answered step, and only those, happened
