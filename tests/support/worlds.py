"""Worlds compared and shaped by tests: fingerprints, full game state, cleared surroundings, vitals kept up,
and a factory that remembers the worlds it handed out."""

from __future__ import annotations

import hashlib
import weakref
from typing import Any

import numpy as np

from task_app.game import VITALS, Game, GameEnv, WorldFactory


def world_state(env: Any) -> dict[str, Any]:
    """Everything that defines a world right after reset, comparable with `==`.

    Works on both `GameEnv` and stock `crafter.Env` (private attributes, as crafter names them).
    """
    world, player = env._world, env._player
    return {
        "materials": world._mat_map.tobytes(),
        "material_names": dict(world._mat_names),
        "objects": [(type(obj).__name__, int(obj.pos[0]), int(obj.pos[1]), int(obj.health)) for obj in world.objects],
        "player": (int(player.pos[0]), int(player.pos[1]), int(player.facing[0]), int(player.facing[1])),
        "inventory": dict(player.inventory),
        "achievements": dict(player.achievements),
        "daylight": float(world.daylight),
        "step": env._step,
    }


def world_digest(env: Any) -> str:
    """A short hash of the material map and the objects (type, position, health)."""
    state = world_state(env)
    digest = hashlib.sha256(state["materials"])
    digest.update(repr(state["objects"]).encode())
    digest.update(repr(state["player"]).encode())
    return digest.hexdigest()


def clear_around(env: GameEnv, radius: int, material: str = "grass") -> None:
    """Remove every creature but the player and cover a square of `radius` around it with `material`."""
    world, player = env.world, env.player
    for obj in world.objects:
        if obj is not player:
            world.remove(obj)
    px, py = int(player.pos[0]), int(player.pos[1])
    for x in range(px - radius, px + radius + 1):
        for y in range(py - radius, py + radius + 1):
            if 0 <= x < world.area[0] and 0 <= y < world.area[1]:
                world[x, y] = material


def keep_alive(env: GameEnv) -> None:
    """Refill the vitals so long random walks outlive hunger and thirst (applied identically to every run)."""
    for vital in VITALS:
        env.player.inventory[vital] = 9


_ENV_LINKS = {"_textures", "_local_view", "_item_view", "_sem_view", "_world", "_player"}


def game_state(game: Game) -> dict[str, Any]:
    """Every attribute of the env, its world and its objects, and the generator's state, comparable with ==.

    References are written as roles (the world, its generator, an object by its index), so two games
    compare equal exactly when they are copies of each other."""
    env = game.env
    world = env._world
    index = {id(obj): position for position, obj in enumerate(world._objects) if obj is not None}

    def plain(value: Any) -> Any:
        if value is world:
            return "<world>"
        if value is world.random:
            return "<random>"
        if id(value) in index:
            return ("<object>", index[id(value)])
        if isinstance(value, np.ndarray):
            return ("ndarray", value.dtype.str, value.shape, value.tobytes())
        if isinstance(value, np.generic):
            return ("numpy", value.dtype.str, value.item())
        if isinstance(value, dict):
            return ("dict", [(plain(key), plain(item)) for key, item in value.items()])
        if isinstance(value, list | tuple):
            return (type(value).__name__, [plain(item) for item in value])
        if isinstance(value, set):
            return ("set", sorted(repr(plain(item)) for item in value))
        return (type(value).__name__, value)

    name, keys, position, has_gauss, gauss = world.random.get_state()
    return {
        "env": {key: plain(value) for key, value in vars(env).items() if key not in _ENV_LINKS},
        "player": index[id(env._player)],
        "world": {key: plain(value) for key, value in vars(world).items() if key not in {"random", "_chunks"}},
        # chunk keys are ints or numpy ints depending on how crafter computed them: compare their values
        "objects": [
            (position, type(obj).__name__, {key: plain(value) for key, value in vars(obj).items()})
            for position, obj in enumerate(world._objects)
            if obj is not None
        ],
        "chunks": [
            (tuple(int(part) for part in key), sorted(index[id(obj)] for obj in objs))
            for key, objs in world._chunks.items()
        ],
        "random": (name, keys.tobytes(), position, has_gauss, gauss),
        "game": (game.terminated, game.truncated, game.decisions),
    }


class RecordedWorlds:
    """The factory, with a weak reference to every world it hands out (to see what is freed when)."""

    def __init__(self, worlds: WorldFactory) -> None:
        self.worlds = worlds
        self.made: list[weakref.ref[Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.worlds, name)

    def world(self, *args: Any) -> GameEnv:
        env = self.worlds.world(*args)
        self.made.append(weakref.ref(env.world))
        return env
