"""The compact observation text (task_app/game/compact_text.py): the same facts as the full text in
fewer characters, chosen per request with `observation: "compact"` on the env-session routes and with
`env.observation` on /rollout."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from conftest import expect_error

from task_app.game import Game, WorldFactory
from task_app.game.actions import plan_from_names
from task_app.game.compact_text import compact_text, observation_text


def _played(worlds: WorldFactory) -> Game:
    game = Game(worlds.generate(3, (64, 64), 10000))
    for action in ("move_left", "do", "move_up", "do", "move_left") * 3:
        game.step(plan_from_names([action], 8))
    return game


def test_the_compact_text_keeps_the_full_texts_facts(worlds: WorldFactory) -> None:
    observation = _played(worlds).observe()
    full, compact = observation.text, compact_text(observation)
    assert len(compact) < 0.6 * len(full)
    assert compact.splitlines()[0] == full.splitlines()[0] == "Step 15/10000, day"
    assert "HP 9 Food 9 Drink 9 Energy 9 | sapling 2" in compact
    assert "Done 1/22: collect_sapling" in compact
    assert "At 26,29 facing left: grass" in compact
    full_map = full.splitlines()[7:14]  # the 9x7 window, the same rows in both
    assert all(row in compact.splitlines() for row in full_map) and len(full_map) == 7
    assert "Near: tree 2R, water 4R12D" in compact and "none: table, furnace, plant" in compact
    assert observation_text(observation) == full and observation_text(observation, "compact") == compact


def test_the_end_of_an_episode_is_said(worlds: WorldFactory) -> None:
    game = Game(worlds.generate(5, (64, 64), 2))
    _, observation = game.step(plan_from_names(["noop", "noop"], 8))
    assert "The episode has reached its length limit." in compact_text(observation).splitlines()


@pytest.mark.e2e
def test_env_sessions_answer_in_the_format_each_request_names(client: httpx.Client) -> None:
    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = client.post(path, json=body)
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer

    created = post("/create", {"env_name": "crafter", "seed": 3, "observation": "compact"})
    env_id = created["env_id"]
    assert created["observation"]["text"].splitlines()[1].startswith("HP 9")
    assert created["observation"]["inventory"]["health"] == 9  # the structured fields are the same
    calls = [{"tool": "interact_many", "args": {"actions": ["move_left"]}}]
    stepped = post("/step", {"env_id": env_id, "tool_calls": calls, "observation": "compact"})
    assert stepped["observation"]["text"].startswith("Step 1/")
    assert "Key: " in stepped["observation"]["text"]
    full = post("/step", {"env_id": env_id, "tool_calls": calls})  # the default: full
    assert "Map around you" in full["observation"]["text"]
    reset = post("/reset", {"env_id": env_id, "observation": "compact"})
    assert "Near: " in reset["observation"]["text"]
    snapshot = post("/snapshot", {"env_id": env_id})
    restored = post("/restore", {"snapshot_id": snapshot["snapshot_id"], "observation": "compact"})
    assert restored["observation"]["text"] == reset["observation"]["text"]
    for env in (env_id, restored["env_id"]):
        post("/terminate", {"env_id": env})
    refused = client.post("/create", json={"env_name": "crafter", "seed": 3, "observation": "tiny"})
    expect_error(refused, 422, "invalid_request")


@pytest.mark.e2e
def test_a_rollout_shows_its_policy_the_compact_text(client: httpx.Client) -> None:
    body = {
        "run_id": "compact-rollout-1",
        "mode": "eval",
        "env": {"env_name": "crafter", "seed": 3, "observation": "compact"},
        "policy": {"policy_name": "crafter-scripted"},
        "ops": ["agent", "env"] * 2,
        "record": {"return_trace": True},
    }
    response = client.post("/rollout", json=body)
    assert response.status_code == 200, response.text
    assert "HP 9 Food" in response.text and "Map around you" not in response.text
