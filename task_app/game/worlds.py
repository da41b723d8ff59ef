"""World creation and the bounded cache of generated worlds.

A world is a `GameEnv` after `reset()`: identical to stock `crafter.Env(area=, length=, seed=)` after
`reset()`. `worldgen` generates it with compiled whole-grid code (a few milliseconds, the GIL released
for most of it) and hands back what it computed: the material map, the creatures and the RNG state
(`worldgen.GeneratedWorld`, ~8 KB for 64x64). The cache keeps that, keyed by (seed, area, length), and
a repeated seed is rebuilt from it (the creatures placed again on a blank env, no noise): keeping
costs nothing, where a pickled snapshot of the env cost a share of every new world
(docs/decisions/world-generator.md). Every world is a new object graph, so two rollouts on one seed never share
mutable state.

The textures (read-only PNG data, loaded by every `crafter.Env()`) are shared by all worlds: left
out of the blank env's pickle and put back on every copy, never loaded or copied per world.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable
from typing import Any

import crafter
import numpy as np
from crafter import engine

from ..core.lru import LruMap
from . import worldgen


class GameWorld(engine.World):
    """`crafter.engine.World` with its three busiest methods on plain integers.

    Every creature's move looks up its target tile and moves in the object map, each a few numpy
    scalar operations in crafter (`tuple(pos)` of an array, `np.int64` arithmetic for the chunk);
    here the same lookups and updates on the position's integers. The results are the same values
    (a chunk key's parts are `int`s rather than numpy integers: equal, with equal hashes).
    """

    def __getitem__(self, pos: Any) -> tuple[Any, Any]:
        x, y = pos.tolist() if type(pos) is np.ndarray else pos
        if not (0 <= x < self.area[0] and 0 <= y < self.area[1]):
            return None, None
        return self._mat_names[self._mat_map[x, y]], self._objects[self._obj_map[x, y]]

    def move(self, obj: Any, pos: Any) -> None:
        if obj.removed:
            return
        pos = np.array(pos)
        (x, y), (old_x, old_y) = pos.tolist(), obj.pos.tolist()
        obj_map = self._obj_map
        assert obj_map[x, y] == 0  # noqa: S101 - crafter's own check, kept as it is
        obj_map[x, y] = obj_map[old_x, old_y]
        obj_map[old_x, old_y] = 0
        old_chunk, new_chunk = self.chunk_key((old_x, old_y)), self.chunk_key((x, y))
        if old_chunk != new_chunk:
            self._chunks[old_chunk].remove(obj)
            self._chunks[new_chunk].add(obj)
        obj.pos = pos

    def chunk_key(self, pos: Any) -> tuple[int, int, int, int]:
        x, y = pos.tolist() if type(pos) is np.ndarray else pos
        size_x, size_y = self._chunk_size
        x_min, y_min = x // size_x * size_x, y // size_y * size_y
        return x_min, min(x_min + size_x, self.area[0]), y_min, min(y_min + size_y, self.area[1])


class GameEnv(crafter.Env):
    """`crafter.Env` that renders a frame only when asked, on a `GameWorld`.

    Stock `Env.step()` renders the frame every step, and at night that render draws noise from the
    world's RNG. `_obs` keeps exactly that RNG draw (so trajectories equal stock crafter's) without
    paying for the picture; `frame()` renders on demand with the world RNG left untouched.
    """

    _last_health: Any  # crafter's own attribute (set by reset and step); typed for the checker

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._world.__class__ = GameWorld

    def _obs(self) -> None:
        if self._world.daylight < 0.5:  # crafter's night threshold in LocalView._light
            unit = self._size // self._view
            shape = tuple(int(v) for v in self._local_view._grid * unit)
            self._world.random.uniform(32, 127, shape)

    def _balance_chunk(self, chunk: Any, objs: Any) -> None:
        # Stock crafter picks the creature to despawn by index into a list built from a *set* of
        # objects, whose order follows memory addresses: the same seed and actions can then give
        # different worlds. Ordering the chunk's objects by position makes the choice reproducible.
        # (`step` runs `_balance`, which orders them the same way; this is the reference it equals.)
        super()._balance_chunk(chunk, _by_position(objs))

    def step(self, action: int) -> tuple[None, float, bool, dict[str, Any]]:
        """Stock `Env.step` with the same effects on the world, minus the work the app never reads.

        Stock crafter builds an `info` dict every step (inventory and achievement copies, a semantic
        map; here it is empty) and measures each object's distance to the player with numpy calls on
        two-element arrays; here the same distances are plain integers, taken at the same moments
        (each object's at its turn, the player where the updates before it left it). Every tenth step
        the spawn-and-despawn round counts each chunk's grass and path tiles in one pass over the map
        (`_balance`) instead of three masks per chunk. (benchmarks.worldgen_check steps both.)
        """
        self._step += 1
        self._update_time()
        player = self._player
        player.action = crafter.constants.actions[action]
        reach = 2 * max(self._view.tolist())
        px, py = player.pos.tolist()
        for obj in self._world.objects:
            x, y = obj.pos.tolist()
            if abs(x - px) + abs(y - py) < reach:
                obj.update()
                px, py = player.pos.tolist()
        if self._step % 10 == 0:
            self._balance()
        self._obs()
        reward = (player.health - self._last_health) / 10
        self._last_health = player.health
        unlocked = {name for name, count in player.achievements.items() if count > 0 and name not in self._unlocked}
        if unlocked:
            self._unlocked |= unlocked
            reward += 1.0
        dead = player.health <= 0
        over = self._length and self._step >= self._length
        return None, (reward if self._reward else 0.0), bool(dead or over), {}

    def _balance(self) -> None:
        """`_balance_chunk` over every chunk, as stock `Env.step` runs it, with the same random draws in
        the same order. Crafter masks the chunk's tiles of a material three times per chunk to count
        them; the round's counts come from one pass here, since spawning and
        despawning creatures never changes a tile."""
        world, player = self._world, self._player
        light = world.daylight
        grass, path = _chunk_tiles(world, "grass"), _chunk_tiles(world, "path")
        objects = crafter.objects
        # Crafter's three calls of `_balance_object`: the kind, its material and how many tiles of it a
        # chunk has, the target range for that many, the spawn/despawn distances and probabilities.
        kinds: tuple[tuple[type, str, Callable[[Any], int], Callable[[int], tuple[float, float]], Any, Any], ...] = (
            (
                objects.Zombie,
                "grass",
                grass,
                lambda tiles: (0 if tiles < 50 else 3.5 - 3 * light, 3.5 - 3 * light),
                (6, 0, 0.3, 0.4),
                lambda pos: objects.Zombie(world, pos, player),
            ),
            (
                objects.Skeleton,
                "path",
                path,
                lambda tiles: (0 if tiles < 6 else 1, 2),
                (7, 7, 0.1, 0.1),
                lambda pos: objects.Skeleton(world, pos, player),
            ),
            (
                objects.Cow,
                "grass",
                grass,
                lambda tiles: (0 if tiles < 30 else 1, 1.5 + light),
                (5, 5, 0.01, 0.1),
                lambda pos: objects.Cow(world, pos),
            ),
        )
        for chunk, objs in world.chunks.items():
            ordered = _by_position(objs)
            for kind, material, tiles, target, rates, ctor in kinds:
                self._balance_kind(chunk, ordered, kind, material, target(tiles(chunk)), rates, ctor)

    def _balance_kind(
        self,
        chunk: tuple[int, int, int, int],
        objs: list[Any],
        kind: type,
        material: str,
        target: tuple[float, float],
        rates: tuple[int, int, float, float],
        ctor: Callable[[np.ndarray], Any],
    ) -> None:
        """Crafter's `_balance_object` for one kind of creature in one chunk, given its target range."""
        span_dist, despan_dist, spawn_prob, despawn_prob = rates
        random = self._world.random
        creatures = [obj for obj in objs if isinstance(obj, kind)]
        if len(creatures) < int(target[0]) and random.uniform() < spawn_prob:
            xmin, xmax, ymin, ymax = chunk
            mask = self._world.mask(*chunk, material)
            xs = np.tile(np.arange(xmin, xmax)[:, None], [1, ymax - ymin])[mask]
            ys = np.tile(np.arange(ymin, ymax)[None, :], [xmax - xmin, 1])[mask]
            i = random.randint(0, len(xs))
            pos = np.array((xs[i], ys[i]))
            if self._world[pos][1] is None and self._player.distance(pos) >= span_dist:
                self._world.add(ctor(pos))
        elif len(creatures) > int(target[1]) and random.uniform() < despawn_prob:
            obj = creatures[random.randint(0, len(creatures))]
            if self._player.distance(obj.pos) >= despan_dist:
                self._world.remove(obj)

    def frame(self, size: int = 64) -> np.ndarray:
        """The RGB frame stock crafter would show, without advancing the world's RNG."""
        world = self._world
        saved, world.random = world.random, np.random.RandomState(self._step or 0)
        try:
            frame: np.ndarray = self.render((size, size))
            return frame
        finally:
            world.random = saved

    @property
    def player(self) -> Any:
        return self._player

    @property
    def world(self) -> engine.World:
        return self._world

    @property
    def step_count(self) -> int:
        return int(self._step or 0)

    @property
    def length(self) -> int:
        return int(self._length or 0)

    def release(self) -> None:
        """Breaks crafter's reference cycles (each object holds its world, the world its objects and
        their chunk sets), so that the world is freed when the env's last reference goes, not at the
        next full garbage collection (~110 objects a 20-decision rollout left to the cycle collector, 0
        after). The env is unusable after."""
        world = self._world
        world._objects = [None]
        world._chunks.clear()


def _texture_holders(env: GameEnv) -> tuple[Any, ...]:
    """What refers to crafter's textures (read-only images, slow to load): the env and two views."""
    return (env, env._local_view, env._item_view)


def _by_position(objs: Any) -> list[Any]:
    return sorted(objs, key=lambda obj: obj.pos.tolist())


def _chunk_tiles(world: engine.World, material: str) -> Callable[[tuple[int, int, int, int]], int]:
    """How many tiles of `material` each chunk holds, for every chunk at once: crafter's chunks tile
    the map from (0, 0) in steps of the chunk size (the last ones cut at the map's edge)."""
    size_x, size_y = world._chunk_size
    area_x, area_y = world._mat_map.shape
    tiles = world._mat_map == world._mat_ids[material]
    counts = np.add.reduceat(np.add.reduceat(tiles, range(0, area_x, size_x), axis=0), range(0, area_y, size_y), axis=1)
    table = counts.tolist()
    return lambda chunk: int(table[chunk[0] // size_x][chunk[2] // size_y])


WorldKey = tuple[int, tuple[int, int], int]


class WorldFactory:
    """Builds worlds, rebuilding the seeds generated before from what their generation computed.
    Thread-safe."""

    def __init__(self, cache_size: int = 512) -> None:
        self._generated: LruMap[WorldKey, worldgen.GeneratedWorld] = LruMap(cache_size)
        self._blanks: dict[tuple[tuple[int, int], int], bytes] = {}
        self._lock = threading.Lock()
        self._generating: dict[WorldKey, threading.Lock] = {}  # one generation per new world at a time
        self._textures = engine.Textures(crafter.constants.root / "assets")
        self.hits = 0
        self.misses = 0

    def _blank(self, area: tuple[int, int], length: int) -> GameEnv:
        """A constructed, not yet reset env for (area, length): a pickle of one built once (crafter's
        constructor loads the textures), without the textures, which its three holders share
        with every world, detached for the dump, so pickle runs in C without a persistent-id call per
        object; and without its world's generator, which its caller seeds or sets (an unpickled
        RandomState is built from the OS's entropy first, most of a blank's cost). Only this
        factory's own bytes are ever unpickled."""
        with self._lock:
            blank = self._blanks.get((area, length))
            if blank is None:
                built = GameEnv(area=area, length=length, seed=0)
                for holder in _texture_holders(built):
                    holder._textures = None
                built._world.random = None
                blank = self._blanks[(area, length)] = pickle.dumps(built, protocol=pickle.HIGHEST_PROTOCOL)
        env: GameEnv = pickle.loads(blank)
        for holder in _texture_holders(env):
            holder._textures = self._textures
        env._world.random = worldgen.unset_random()
        return env

    def blank(self, area: tuple[int, int], length: int) -> GameEnv:
        """A constructed, never reset env (textures shared): what a checkpoint is loaded into."""
        return self._blank((area[0], area[1]), length)

    def generate(self, seed: int, area: tuple[int, int], length: int) -> GameEnv:
        """A freshly generated world, bypassing the cache."""
        return self._generate(seed, area, length)[0]

    def _generate(self, seed: int, area: tuple[int, int], length: int) -> tuple[GameEnv, worldgen.GeneratedWorld]:
        env = self._blank(area, length)
        env._seed = seed
        return env, worldgen.reset(env)

    def _rebuild(self, key: WorldKey, generated: worldgen.GeneratedWorld) -> GameEnv:
        seed, area, length = key
        env = self._blank(area, length)
        env._seed = seed
        worldgen.rebuild(env, generated)
        return env

    def world(self, seed: int, area: tuple[int, int] = (64, 64), length: int = 10_000) -> GameEnv:
        """The world for `seed` right after reset: rebuilt from the cache, or generated and cached.
        Concurrent requests for one new world (a GRPO group) wait for one generation and rebuild it
        after. Every call returns a new object graph: two rollouts on one seed share nothing mutable."""
        key: WorldKey = (seed, (area[0], area[1]), length)
        generated = self._cached(key)
        if generated is not None:
            return self._rebuild(key, generated)
        with self._lock:
            gate = self._generating.setdefault(key, threading.Lock())
        with gate:
            generated = self._cached(key)
            if generated is not None:
                return self._rebuild(key, generated)
            env, generated = self._generate(seed, area, length)
            if self._generated.max_items:
                with self._lock:
                    self.misses += 1
                    self._generated.put(key, generated)
        with self._lock:
            if self._generating.get(key) is gate:
                del self._generating[key]
        return env

    def _cached(self, key: WorldKey) -> worldgen.GeneratedWorld | None:
        with self._lock:
            generated = self._generated.get(key)
            if generated is not None:
                self.hits += 1
        return generated

    def __len__(self) -> int:
        return len(self._generated)
