"""World traits for `/task_info`: what surrounds the player at the start of a seed's world."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .observation import SEMANTIC_IDS
from .worlds import GameEnv

TRAIT_RADIUS = 10
# (name, min_trees, max_hostiles), first match wins; no match is "custom" (docs/compatibility.md, "World traits").
DIFFICULTY_BOUNDS: tuple[tuple[str, int, int], ...] = (("easy", 4, 0), ("medium", 2, 2), ("hard", 0, 5))


@dataclass(frozen=True, slots=True)
class WorldTraits:
    trees: int
    cows: int
    hostiles: int
    difficulty: str
    inventory: dict[str, int]
    player_position: tuple[int, int]

    def as_dict(self) -> dict[str, Any]:
        return {"trees": self.trees, "cows": self.cows, "hostiles": self.hostiles}


def difficulty_of(trees: int, hostiles: int) -> str:
    for name, min_trees, max_hostiles in DIFFICULTY_BOUNDS:
        if trees >= min_trees and hostiles <= max_hostiles:
            return name
    return "custom"


def world_traits(env: GameEnv, radius: int = TRAIT_RADIUS) -> WorldTraits:
    """Trees (map material) and creatures (objects) within Manhattan `radius` of the player."""
    player = env.player
    px, py = int(player.pos[0]), int(player.pos[1])
    semantic = env.semantic()
    xs, ys = np.indices(semantic.shape)
    near = (np.abs(xs - px) + np.abs(ys - py)) <= radius
    near[px, py] = False

    def count(kind: str) -> int:
        return int(np.count_nonzero(near & (semantic == SEMANTIC_IDS[kind])))

    trees, cows = count("tree"), count("cow")
    hostiles = count("zombie") + count("skeleton")
    return WorldTraits(
        trees=trees,
        cows=cows,
        hostiles=hostiles,
        difficulty=difficulty_of(trees, hostiles),
        inventory={name: int(value) for name, value in player.inventory.items()},
        player_position=(px, py),
    )
