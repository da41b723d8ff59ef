"""Checkpoints capture the whole game: a restored copy is the same object graph, field for field, and
continues exactly as the original (after 200 random decisions that include a death and a night)."""

from __future__ import annotations

import random
import zlib
from typing import Any

import numpy as np
import pytest
from support.worlds import game_state

from task_app.game import ACTIONS, Game, WorldFactory
from task_app.game.actions import plan_from_names
from task_app.game.checkpoint import CheckpointError, dump_game, load_game


def random_calls(rng: random.Random, count: int) -> list[list[str]]:
    return [[rng.choice(ACTIONS) for _ in range(rng.randint(1, 3))] for _ in range(count)]


def play(
    game: Game, calls: list[list[str]], worlds: WorldFactory, seed: int
) -> tuple[Game, list[Any], dict[str, bool]]:
    """Apply the calls; a new episode (the same seed's world) after each end. Returns what was seen."""
    seen: list[Any] = []
    events = {"death": False, "night": False}
    for actions in calls:
        outcome, observation = game.step(plan_from_names(actions, 8))
        events["night"] |= bool(game.env.world.daylight < 0.5)
        events["death"] |= game.terminated
        seen.append((observation.text, observation.data, [result.as_dict() for result in outcome.results], game.done))
        if game.done:
            game = Game(worlds.world(seed))
    return game, seen, events


def test_a_restored_game_is_the_same_graph_and_continues_identically(worlds: WorldFactory) -> None:
    seed, rng = 7, random.Random(7)
    original, _, before = play(Game(worlds.world(seed)), random_calls(rng, 200), worlds, seed)
    assert before == {"death": True, "night": True}  # the 200 decisions included a death and a night

    data = dump_game(original, {"episode": 2})
    restored, extra = load_game(data, worlds)
    assert extra == {"episode": 2}
    assert game_state(restored) == game_state(original)
    assert restored.env._sem_view._world is restored.env.world  # the views see the restored world
    assert np.array_equal(restored.env.frame(64), original.env.frame(64))
    assert restored.env.world is not original.env.world

    after = random_calls(rng, 300)
    original, seen_original, _ = play(original, after, worlds, seed)
    restored, seen_restored, _ = play(restored, after, worlds, seed)
    assert seen_restored == seen_original  # observations, rewards (per action), unlocks and done, all 300
    assert game_state(restored) == game_state(original)


def test_checkpoints_are_deterministic_bytes(worlds: WorldFactory) -> None:
    game = Game(worlds.world(3))
    game.step(plan_from_names(["move_left", "do", "noop"], 8))
    first = dump_game(game)
    assert dump_game(game) == first
    assert dump_game(load_game(first, worlds)[0]) == first
    assert len(first) < 16_000


def test_anything_the_format_does_not_know_is_refused(worlds: WorldFactory) -> None:
    game = Game(worlds.world(3))
    game.env.player.mystery = object()
    with pytest.raises(CheckpointError, match="cannot checkpoint a object"):
        dump_game(game)
    del game.env.player.mystery
    game.env.player.cooldowns = {1: 2}  # dict keys must be strings
    with pytest.raises(CheckpointError):
        dump_game(game)
    for garbage in (b"", b"not zlib", zlib.compress(b'{"format": 99}')):
        with pytest.raises(CheckpointError):
            load_game(garbage, worlds)
