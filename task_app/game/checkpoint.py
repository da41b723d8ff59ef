"""A whole Crafter game as plain data: checkpoints and snapshots of env sessions, restored exactly.

    dump_game(game) ─► zlib(JSON) ─► load_game(data, worlds) ─► a Game that continues exactly as the original

What is captured is everything `crafter.Env.step` reads or writes: the env's counters (step, episode,
seed, last health, unlocked achievements), the world (material map, material ids, daylight, the
random generator's full MT19937 state, the order of its object list with its holes and of its chunk
table) and every object with all of its attributes (position, health and inventory, the player's
facing, achievements, sleep, hunger/thirst/fatigue/recovery counters, a zombie's cooldown, a
skeleton's reload, an arrow's direction, a plant's growth, ...). Objects are written generically from
their `__dict__`, so an attribute crafter adds is captured too, or refused loudly if it is of a kind
this format does not know; the classes are a fixed list of crafter's own.

Why not pickle: the bytes live in the shared state store and are read back by other processes. A
pickle there would be code run on load; this format is JSON (numbers, strings, tagged numpy arrays
and tuples) and the loader builds only the crafter classes listed below, so a corrupt or hostile value
can at worst fail to load. Numbers survive exactly: JSON floats round-trip (shortest repr), and ints
stay ints. Dicts keep their order (crafter draws and prints the inventory in its order), which also
makes the bytes deterministic: the same game gives the same checkpoint.
"""

from __future__ import annotations

import base64
import math
import zlib
from typing import Any

import numpy as np
from crafter import objects

from ..core import json_codec
from .episode import Game
from .worlds import EnvState, GameEnv, WorldFactory

FORMAT = 1
_CLASSES: dict[str, Any] = {
    cls.__name__: cls
    for cls in (
        objects.Player,
        objects.Cow,
        objects.Zombie,
        objects.Skeleton,
        objects.Arrow,
        objects.Plant,
        objects.Fence,
    )
}
_REFERENCES = frozenset({"world", "random", "player"})  # re-linked on load, never written


class CheckpointError(ValueError):
    """The game holds something this format cannot write, or the bytes are not a checkpoint."""


def _encode(value: Any) -> Any:
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, np.ndarray):
        return {"~nd": value.dtype.str, "shape": list(value.shape), "v": _encode(value.tolist())}
    if isinstance(value, np.generic):
        return {"~np": value.dtype.str, "v": _encode(value.item())}
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CheckpointError(f"not a finite number: {value!r}")
        return value
    if isinstance(value, tuple):
        return {"~t": [_encode(item) for item in value]}
    if isinstance(value, list):
        return [_encode(item) for item in value]
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {"~d": {key: _encode(item) for key, item in value.items()}}
    raise CheckpointError(f"cannot checkpoint a {type(value).__name__}")


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(item) for item in value]
    if not isinstance(value, dict):
        return value
    if "~nd" in value:
        return np.array(_decode(value["v"]), dtype=np.dtype(value["~nd"])).reshape(value["shape"])
    if "~np" in value:
        return np.dtype(value["~np"]).type(value["v"])
    if "~t" in value:
        return tuple(_decode(item) for item in value["~t"])
    if "~d" in value:
        return {key: _decode(item) for key, item in value["~d"].items()}
    raise CheckpointError(f"unknown tagged value {sorted(value)}")


def _bytes(array: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(array).tobytes()).decode("ascii")


def _array(text: str, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=np.dtype(dtype)).reshape(shape).copy()


def _object_doc(index: int, obj: objects.Object, env: GameEnv) -> dict[str, Any]:
    kind = type(obj).__name__
    if _CLASSES.get(kind) is not type(obj):
        raise CheckpointError(f"unknown object class {kind}")
    if obj.world is not env.world or obj.random is not env.world.random:
        raise CheckpointError(f"{kind} at {index} belongs to another world")
    if getattr(obj, "player", env.player) is not env.player:
        raise CheckpointError(f"{kind} at {index} follows another player")
    attributes = {name: _encode(value) for name, value in vars(obj).items() if name not in _REFERENCES}
    return {"i": index, "kind": kind, "player": "player" in vars(obj), "attrs": attributes}


def dump_game(game: Game, extra: dict[str, Any] | None = None) -> bytes:
    """The game (env, world, objects, end flags) and `extra` (JSON data of the caller's) as bytes."""
    env = game.env
    state = env.state()
    generator = state.random.get_state(legacy=False)
    mt_state = generator["state"]
    items = [_object_doc(index, obj, env) for index, obj in enumerate(state.slots) if obj is not None]
    if env.player is None or not any(item["kind"] == "Player" for item in items):
        raise CheckpointError("the game has no player")
    doc = {
        "format": FORMAT,
        "env": {
            "area": list(env.world.area),
            "length": env.length,
            "seed": _encode(state.seed),
            "episode": state.episode,
            "step": state.step,
            "last_health": _encode(state.last_health),
            "unlocked": sorted(state.unlocked),
        },
        "world": {
            "chunk_size": list(state.chunk_size),
            "materials": state.material_names,
            "mat_map": _bytes(state.materials.astype(np.uint8)),
            "daylight": _encode(state.daylight),
            "random": {
                "name": generator["bit_generator"],
                "keys": _bytes(mt_state["key"].astype("<u4")),
                "pos": int(mt_state["pos"]),
            },
            "gauss": [int(generator["has_gauss"]), _encode(float(generator["gauss"]))],
            "slots": len(state.slots),
            "chunks": [[int(part) for part in key] for key in state.chunk_keys],
        },
        "objects": items,
        "game": {"terminated": game.terminated, "truncated": game.truncated, "decisions": game.decisions},
        "extra": extra or {},
    }
    return zlib.compress(json_codec.dumps_bytes(doc), 6)  # dicts keep their order: crafter iterates the inventory


def _load_objects(world: Any, random: np.random.RandomState, items: list[dict[str, Any]], slots: int) -> list[Any]:
    """The world's object list (holes included), each object linked to `world`, `random` and the player."""
    loaded: list[Any] = [None] * slots
    player: objects.Player | None = None
    followers: list[objects.Object] = []
    for item in items:
        cls = _CLASSES.get(item["kind"])
        if cls is None:
            raise CheckpointError(f"unknown object class {item['kind']!r}")
        obj = object.__new__(cls)  # no __init__: every attribute comes from the checkpoint
        obj.world, obj.random = world, random
        obj.__dict__.update({name: _decode(value) for name, value in item["attrs"].items()})
        if item["player"]:
            followers.append(obj)
        if isinstance(obj, objects.Player):
            player = obj
        loaded[int(item["i"])] = obj
    if player is None:
        raise CheckpointError("the checkpoint has no player")
    for obj in followers:
        obj.__dict__["player"] = player
    return loaded


def load_game(data: bytes, worlds: WorldFactory, image_size: int | None = None) -> tuple[Game, dict[str, Any]]:
    """The game `dump_game` wrote, in a fresh env (textures shared with `worlds`), and its `extra`."""
    try:
        doc = json_codec.loads(zlib.decompress(data))
    except (zlib.error, ValueError) as exc:
        raise CheckpointError(f"not a checkpoint: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CheckpointError("not a checkpoint of this format")
    state, saved = doc["env"], doc["world"]
    area = (int(state["area"][0]), int(state["area"][1]))
    env = worlds.blank(area, int(state["length"]))
    generator, (has_gauss, gauss) = saved["random"], saved["gauss"]
    random = np.random.RandomState()
    random.set_state((generator["name"], _array(generator["keys"], "<u4", (-1,)), generator["pos"], has_gauss, gauss))
    env.restore(
        EnvState(
            seed=_decode(state["seed"]),
            episode=state["episode"],
            step=state["step"],
            last_health=_decode(state["last_health"]),
            unlocked=set(state["unlocked"]),
            chunk_size=(int(saved["chunk_size"][0]), int(saved["chunk_size"][1])),
            material_names=list(saved["materials"]),
            materials=_array(saved["mat_map"], "u1", area),
            daylight=_decode(saved["daylight"]),
            random=random,
            slots=_load_objects(env.world, random, doc["objects"], int(saved["slots"])),
            chunk_keys=[(int(a), int(b), int(c), int(d)) for a, b, c, d in saved["chunks"]],
        )
    )
    flags = doc["game"]
    game = Game(env, image_size=image_size)
    game.terminated, game.truncated, game.decisions = flags["terminated"], flags["truncated"], flags["decisions"]
    return game, dict(doc["extra"])
