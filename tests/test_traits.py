"""World traits for /task_info: trees from the material map, creatures from the objects, difficulty."""

from __future__ import annotations

import numpy as np
import pytest
from crafter import objects
from support.worlds import clear_around

from task_app.game import GameEnv, WorldFactory, world_traits
from task_app.game.traits import difficulty_of


@pytest.fixture
def empty(worlds: WorldFactory) -> GameEnv:
    """Seed 4's world with grass up to 14 tiles around the player and no creatures."""
    env = worlds.world(4)
    clear_around(env, 14)
    return env


def _at(env: GameEnv, dx: int, dy: int) -> tuple[int, int]:
    return int(env.player.pos[0]) + dx, int(env.player.pos[1]) + dy


def test_trees_are_counted_from_the_material_map_within_radius(empty: GameEnv) -> None:
    for offset in [(1, 0), (0, -5), (-3, 7), (10, 0), (-5, -5)]:  # Manhattan 1, 5, 10, 10, 10
        empty.world[_at(empty, *offset)] = "tree"
    for offset in [(11, 0), (6, -6), (0, 14)]:  # 11, 12, 14: outside
        empty.world[_at(empty, *offset)] = "tree"
    traits = world_traits(empty)
    assert traits.trees == 5
    assert (traits.cows, traits.hostiles) == (0, 0)
    assert traits.difficulty == "easy"


def test_creatures_are_counted_from_the_objects(empty: GameEnv) -> None:
    world, player = empty.world, empty.player
    world.add(objects.Cow(world, _at(empty, 2, 1)))
    world.add(objects.Cow(world, _at(empty, -10, 0)))
    world.add(objects.Cow(world, _at(empty, 0, 11)))  # too far
    world.add(objects.Zombie(world, _at(empty, 3, 3), player))
    world.add(objects.Skeleton(world, _at(empty, -1, -9), player))
    world.add(objects.Zombie(world, _at(empty, 8, 5), player))  # too far
    empty.world[_at(empty, 0, 2)] = "tree"
    empty.world[_at(empty, 0, 3)] = "tree"
    traits = world_traits(empty)
    assert (traits.trees, traits.cows, traits.hostiles) == (2, 2, 2)
    assert traits.difficulty == "medium"
    assert traits.as_dict() == {"trees": 2, "cows": 2, "hostiles": 2}
    assert traits.player_position == _at(empty, 0, 0)
    assert traits.inventory["health"] == 9 and traits.inventory["wood"] == 0


def test_saplings_are_not_trees_and_cows_count(empty: GameEnv) -> None:
    world = empty.world
    world.add(objects.Cow(world, _at(empty, 1, 1)))
    world.add(objects.Plant(world, _at(empty, 2, 2)))  # a sapling is not a tree
    assert (world_traits(empty).trees, world_traits(empty).cows) == (0, 1)


def test_custom_radius(empty: GameEnv) -> None:
    empty.world[_at(empty, 4, 0)] = "tree"
    assert world_traits(empty, radius=3).trees == 0
    assert world_traits(empty, radius=4).trees == 1


@pytest.mark.parametrize("seed", [0, 1, 42])
def test_real_worlds_agree_with_a_direct_count(worlds: WorldFactory, seed: int) -> None:
    env = worlds.world(seed)
    px, py = int(env.player.pos[0]), int(env.player.pos[1])
    xs, ys = np.indices(env.world.area)
    near = np.abs(xs - px) + np.abs(ys - py) <= 10
    tree_id = env.world._mat_ids["tree"]
    trees = int(np.count_nonzero(near & (env.world._mat_map == tree_id)))

    def creatures(*kinds: type) -> int:
        return sum(
            1
            for obj in env.world.objects
            if isinstance(obj, kinds) and abs(obj.pos[0] - px) + abs(obj.pos[1] - py) <= 10
        )

    traits = world_traits(env)
    assert traits.trees == trees
    assert traits.cows == creatures(objects.Cow)
    assert traits.hostiles == creatures(objects.Zombie, objects.Skeleton)
    assert traits.difficulty == difficulty_of(trees, traits.hostiles)


@pytest.mark.parametrize(
    ("trees", "hostiles", "difficulty"),
    [
        (4, 0, "easy"),
        (30, 0, "easy"),
        (4, 1, "medium"),
        (3, 0, "medium"),
        (2, 2, "medium"),
        (1, 0, "hard"),
        (2, 3, "hard"),
        (0, 5, "hard"),
        (9, 5, "hard"),
        (0, 6, "custom"),
        (20, 9, "custom"),
    ],
)
def test_difficulty_buckets(trees: int, hostiles: int, difficulty: str) -> None:
    assert difficulty_of(trees, hostiles) == difficulty
