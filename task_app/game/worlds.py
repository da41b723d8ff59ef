"""Crafter's env as the app runs it, and the bounded cache of generated worlds.

A world is a `GameEnv` after `generate()` or `rebuild()`: the same state as stock
`crafter.Env(area=, length=, seed=)` leaves after `reset()`. `generate` runs the compiled generator
(`worldgen`, docs/decisions/world-generator.md) and keeps what it computed (`worldgen.GeneratedWorld`);
the factory caches that per (seed, area, length), and a repeated seed is rebuilt from it without the
noise. Every world is a new object graph, so two rollouts on one seed never share mutable state.

Crafter's internals. Crafter's `Env` and `World` keep all of their state in private attributes and
offer no public way to start an episode on a generated world, to read the player, the map or the
counters, or to restore them; `GameEnv` is the one place in the app that reads or writes them, as a
subclass, and everything else uses its public methods and properties. What it needs, and why:

- `Env._world`, `_player`, `_seed`, `_episode`, `_step`, `_last_health`, `_unlocked`, `_length` and
  `_update_time()`: `_new_episode` is crafter's `Env.reset` up to its world generation, line for line
  (crafter calls its own generator from inside `reset`); the properties and `state`/`restore` expose
  them to the rest of the app and to checkpoints.
- `World._mat_map`: the generated material map is written as a whole (crafter's public `world[x, y] =`
  sets one tile by name); `World._objects`, `_obj_map`, `_chunks`, `_chunk_size`, `_mat_names`: what a
  checkpoint must capture and restore exactly (the object list with its holes, the chunk table's order),
  and what `_place` fills in as `World.add` would; `World._mat_ids` and `_chunk_size`: `_balance`
  counts each chunk's tiles of a material in one pass over `_mat_map`.
- `Env._sem_view._obj_ids`: crafter's semantic ids of the objects, for `semantic()` (crafter's
  `SemanticView`, the objects set in one assignment).
- `Env._obs`, `_size`, `_view`, `_local_view._grid`: `_obs` is overridden so a step draws crafter's
  night noise without rendering the frame (see `GameEnv`).
- `Env._textures`, `_local_view._textures`, `_item_view._textures`: the read-only textures are loaded
  once per process and shared (crafter's constructor would load them for every env).

crafter is pinned to the minor version these were read from (pyproject.toml); the equivalence tests
(tests/test_worlds.py, tests/test_worldgen.py, `python -m benchmarks.worldgen_check`) compare complete
states and long trajectories with stock crafter's, so a change there fails them.
"""

from __future__ import annotations

import functools
import pickle
import threading
from dataclasses import dataclass
from typing import Any

import crafter
import numpy as np
from crafter import engine, objects

from ..core.lru import LruMap
from . import worldgen

_CREATURES: dict[int, Any] = {  # the kinds of `worldgen.generate`'s creature rows
    worldgen.COW: lambda world, pos, player: objects.Cow(world, pos),
    worldgen.ZOMBIE: objects.Zombie,
    worldgen.SKELETON: objects.Skeleton,
}


@dataclass
class EnvState:
    """Everything `crafter.Env.step` reads or writes besides the objects' own attributes: what a
    checkpoint captures (`GameEnv.state`) and restores (`GameEnv.restore`)."""

    seed: Any
    episode: int
    step: int
    last_health: Any
    unlocked: set[str]
    chunk_size: tuple[int, int]
    material_names: list[str | None]  # by material id
    materials: np.ndarray  # the material map, [x, y]
    daylight: float
    random: np.random.RandomState  # the world's generator (the objects hold it too)
    slots: list[Any]  # the world's object list, holes (None) included: an object's index is its id
    chunk_keys: list[tuple[int, int, int, int]]  # the chunk table's keys in its order (crafter balances in it)


class GameEnv(crafter.Env):
    """`crafter.Env` on worlds from the compiled generator, that renders a frame only when asked.

    Stock `Env.step()` renders the frame every step, and at night that render draws noise from the
    world's RNG. `_obs` keeps exactly that RNG draw (so trajectories equal stock crafter's) without
    paying for the picture; `frame()` renders on demand with the world RNG left untouched.
    """

    # crafter's own attributes (set by reset and step), typed for the checker
    _last_health: Any
    _unlocked: set[str]

    def generate(self, seed: int) -> worldgen.GeneratedWorld:
        """`crafter.Env(seed=seed).reset()` with the compiled generator, on a blank env: the same episode
        counter, world, player and RNG state. Returns what `rebuild` needs to make the same world again."""
        self._seed = seed
        self._new_episode()
        world = self._world
        pos = self._player.pos
        materials, creatures = worldgen.generate(world.area, (int(pos[0]), int(pos[1])), world.random)
        self._place(materials, creatures)
        self._obs()
        return worldgen.GeneratedWorld(materials, creatures, world.random.get_state(legacy=False))

    def rebuild(self, seed: int, generated: worldgen.GeneratedWorld) -> None:
        """The world `generate(seed)` made, on a blank env of the same area and length, without the
        noise: the state `generate` leaves (the equivalence tests compare them)."""
        self._seed = seed
        self._new_episode()
        self._place(generated.materials, generated.creatures)
        self._obs()
        self._world.random.set_state(generated.random_state)

    def _new_episode(self) -> None:
        """crafter's `Env.reset` up to its world generation: the episode counter, a world seeded for it,
        the player at the centre."""
        center = (self._world.area[0] // 2, self._world.area[1] // 2)
        self._episode += 1
        self._step = 0
        self._world.reset(seed=hash((self._seed, self._episode)) % (2**31 - 1))
        self._update_time()
        self._player = objects.Player(self._world, center)
        self._last_health = self._player.health
        self._world.add(self._player)
        self._unlocked = set()

    def _place(self, materials: np.ndarray, creatures: np.ndarray) -> None:
        """The generated materials, and the creatures made by crafter's own classes and added as
        `World.add` adds them (in order, each at the next index of the object list, in its chunk's set),
        on the position's integers: crafter's `add` takes numpy calls per creature, most of a cached
        world's cost (docs/decisions/world-generator.md)."""
        world, player = self._world, self._player
        world._mat_map[...] = materials
        slots, chunks, obj_map = world._objects, world._chunks, world._obj_map
        (size_x, size_y), (area_x, area_y) = world._chunk_size, world.area
        for kind, x, y in creatures.tolist():
            obj = _CREATURES[kind](world, (x, y), player)
            obj_map[x, y] = len(slots)
            slots.append(obj)
            x_min, y_min = x // size_x * size_x, y // size_y * size_y
            chunks[(x_min, min(x_min + size_x, area_x), y_min, min(y_min + size_y, area_y))].add(obj)

    def _obs(self) -> None:
        if self._world.daylight < 0.5:  # crafter's night threshold in LocalView._light
            unit = self._size // self._view
            shape = tuple(int(v) for v in self._local_view._grid * unit)
            self._world.random.uniform(32, 127, shape)

    def _balance(self) -> None:
        """Crafter's creature balancing (`Env._balance_chunk` on every chunk), with the same draws from the
        world's RNG in the same order and the same effects, at a fraction of the cost: the grass and path
        tiles of all chunks are counted in one pass over the map (stock crafter masks and sums a chunk's
        region once per creature kind), and a chunk's objects are sorted into kinds once.

        One change from stock crafter: the creature a chunk despawns is picked from the chunk's creatures
        ordered by position. Stock crafter orders them as a *set* iterates, by memory address, so the same
        seed and actions could give different worlds."""
        world = self._world
        light = world.daylight
        grass, path = self._tiles_per_chunk("grass"), self._tiles_per_chunk("path")
        size_x, size_y = world._chunk_size
        night = 3.5 - 3 * light
        for chunk, objs in world.chunks.items():
            zombies, skeletons, cows = [], [], []
            for obj in sorted(objs, key=lambda obj: obj.pos.tolist()):
                if isinstance(obj, objects.Zombie):
                    zombies.append(obj)
                elif isinstance(obj, objects.Skeleton):
                    skeletons.append(obj)
                elif isinstance(obj, objects.Cow):
                    cows.append(obj)
            index_x, index_y = chunk[0] // size_x, chunk[2] // size_y
            grass_tiles, path_tiles = grass[index_x][index_y], path[index_x][index_y]
            zombie_min = 0 if grass_tiles < 50 else night
            self._balance_kind(chunk, zombies, worldgen.ZOMBIE, "grass", (6, 0), (0.3, 0.4), (zombie_min, night))
            skeleton_min = 0 if path_tiles < 6 else 1
            self._balance_kind(chunk, skeletons, worldgen.SKELETON, "path", (7, 7), (0.1, 0.1), (skeleton_min, 2))
            cow_min = 0 if grass_tiles < 30 else 1
            self._balance_kind(chunk, cows, worldgen.COW, "grass", (5, 5), (0.01, 0.1), (cow_min, 1.5 + light))

    def _tiles_per_chunk(self, material: str) -> list[list[int]]:
        """How many tiles of `material` each chunk holds, [x chunk][y chunk]."""
        world = self._world
        size_x, size_y = world._chunk_size
        tiles = world._mat_map == world._mat_ids[material]
        starts_x, starts_y = np.arange(0, tiles.shape[0], size_x), np.arange(0, tiles.shape[1], size_y)
        per_row = np.add.reduceat(tiles, starts_x, axis=0, dtype=np.intp)
        counts: list[list[int]] = np.add.reduceat(per_row, starts_y, axis=1).tolist()
        return counts

    def _balance_kind(
        self,
        chunk: tuple[int, int, int, int],
        creatures: list[Any],
        kind: int,
        material: str,
        distances: tuple[int, int],
        chances: tuple[float, float],
        targets: tuple[float, float],
    ) -> None:
        """Crafter's `Env._balance_object` for one kind of creature (`worldgen`'s kinds) in one chunk: below
        its target, maybe spawn one on a random `material` tile far enough from the player; above, maybe
        despawn one far enough away."""
        world, player = self._world, self._player
        random = world.random
        (spawn_distance, despawn_distance), (spawn_chance, despawn_chance) = distances, chances
        if len(creatures) < int(targets[0]) and random.uniform() < spawn_chance:
            xmin, _, ymin, _ = chunk
            xs, ys = np.nonzero(world.mask(*chunk, material))
            i = random.randint(0, len(xs))
            pos = np.array((xs[i] + xmin, ys[i] + ymin))
            if world[pos][1] is None and player.distance(pos) >= spawn_distance:
                world.add(_CREATURES[kind](world, pos, player))
        elif len(creatures) > int(targets[1]) and random.uniform() < despawn_chance:
            obj = creatures[random.randint(0, len(creatures))]
            if player.distance(obj.pos) >= despawn_distance:
                world.remove(obj)

    def step(self, action: int) -> tuple[None, float, bool, dict[str, Any]]:
        """Stock `Env.step` with the same effects on the world, minus two costs the app never reads.

        Stock crafter builds an `info` dict every step (inventory and achievement copies, a semantic
        map of the whole world; here it is empty: the observation reads the env itself), and measures
        each object's distance to the player with numpy calls on two-element arrays; here the same
        distances are plain integers, taken at the same moments (each object's at its turn, the
        player where the updates before it left it). The two savings, measured against crafter's
        own step, are in docs/decisions/world-generator.md.
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

    def frame(self, size: int = 64) -> np.ndarray:
        """The RGB frame stock crafter would show, without advancing the world's RNG."""
        world = self._world
        saved, world.random = world.random, np.random.RandomState(self._step or 0)
        try:
            frame: np.ndarray = self.render((size, size))
            return frame
        finally:
            world.random = saved

    def semantic(self) -> np.ndarray:
        """The whole map as semantic ids, [x, y]: what crafter's `SemanticView` returns, the objects set
        in one indexed assignment instead of one per object (docs/decisions/world-generator.md)."""
        world = self._world
        canvas: np.ndarray = world._mat_map.copy()
        ids = self._sem_view._obj_ids
        live = [obj for obj in world._objects if obj]
        canvas[[obj.pos[0] for obj in live], [obj.pos[1] for obj in live]] = [ids[type(obj)] for obj in live]
        return canvas

    @property
    def player(self) -> Any:
        return self._player

    @property
    def world(self) -> engine.World:
        return self._world

    @property
    def seed(self) -> int:
        return int(self._seed)

    @property
    def step_count(self) -> int:
        return int(self._step or 0)

    @property
    def length(self) -> int:
        return int(self._length or 0)

    def release(self) -> None:
        """Breaks crafter's reference cycles (each object holds its world, the world its objects and
        their chunk sets), so that the world is freed when the env's last reference goes, not at the
        next full garbage collection. The env is unusable after."""
        world = self._world
        world._objects = [None]
        world._chunks.clear()

    def state(self) -> EnvState:
        """What a checkpoint captures besides the objects' own attributes (the live objects, not copies)."""
        world = self._world
        return EnvState(
            seed=self._seed,
            episode=self._episode,
            step=self._step,
            last_health=self._last_health,
            unlocked=set(self._unlocked or ()),
            chunk_size=tuple(world._chunk_size),
            material_names=[world._mat_names[index] for index in range(len(world._mat_names))],
            materials=world._mat_map,
            daylight=world.daylight,
            random=world.random,
            slots=list(world._objects),
            chunk_keys=list(world._chunks),
        )

    def restore(self, state: EnvState) -> None:
        """This (blank) env in `state`: its objects, already linked to this world and `state.random`,
        take their slots, map cells and chunks; the player is the one `objects.Player` among them."""
        world = self._world
        self._seed, self._episode, self._step = state.seed, state.episode, state.step
        self._last_health, self._unlocked = state.last_health, set(state.unlocked)
        world._chunk_size = tuple(state.chunk_size)
        world._mat_names = dict(enumerate(state.material_names))
        world._mat_ids = {name: index for index, name in world._mat_names.items()}
        world._mat_map = state.materials
        world.daylight = state.daylight
        world.random = state.random
        world._objects = list(state.slots)
        world._obj_map = np.zeros(world.area, np.uint32)
        world._chunks.clear()
        for key in state.chunk_keys:  # the table's order is the order crafter balances chunks in
            world._chunks[tuple(key)] = set()
        for index, obj in enumerate(world._objects):
            if obj is None:
                continue
            world._obj_map[tuple(obj.pos)] = index
            world._chunks[world.chunk_key(obj.pos)].add(obj)
            if isinstance(obj, objects.Player):
                self._player = obj


class _SharedTextures(engine.Textures):
    """Crafter's textures (read-only images), loaded once per process and shared by every env; pickled
    as a reference to that one copy, so a blank env's pickle neither carries nor copies them."""

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return _shared_textures, ()


@functools.cache
def _shared_textures() -> _SharedTextures:
    return _SharedTextures(crafter.constants.root / "assets")


def _template(area: tuple[int, int], length: int) -> GameEnv:
    """A constructed, never reset env for (area, length), on the shared textures and without a world
    generator (each episode seeds a new one)."""
    env = GameEnv(area=area, length=length, seed=0)
    textures = _shared_textures()
    env._textures = env._local_view._textures = env._item_view._textures = textures
    env._world.random = None
    return env


WorldKey = tuple[int, tuple[int, int], int]


class WorldFactory:
    """Builds worlds, rebuilding the seeds generated before from what their generation computed.
    Thread-safe."""

    def __init__(self, cache_size: int = 512) -> None:
        self._generated: LruMap[WorldKey, worldgen.GeneratedWorld] = LruMap(cache_size)
        self._blanks: dict[tuple[tuple[int, int], int], bytes] = {}
        self._lock = threading.Lock()
        self._generating: dict[WorldKey, threading.Lock] = {}  # one generation per new world at a time
        self.hits = 0
        self.misses = 0

    def blank(self, area: tuple[int, int], length: int) -> GameEnv:
        """A constructed, never reset env (textures shared): a copy of one built once per (area,
        length), since crafter's constructor loads the textures. Only this factory's own bytes are
        ever unpickled."""
        key = ((area[0], area[1]), length)
        with self._lock:
            blank = self._blanks.get(key)
            if blank is None:
                blank = self._blanks[key] = pickle.dumps(_template(*key), protocol=pickle.HIGHEST_PROTOCOL)
        env: GameEnv = pickle.loads(blank)
        return env

    def generate(self, seed: int, area: tuple[int, int], length: int) -> GameEnv:
        """A freshly generated world, bypassing the cache."""
        return self._generate(seed, area, length)[0]

    def _generate(self, seed: int, area: tuple[int, int], length: int) -> tuple[GameEnv, worldgen.GeneratedWorld]:
        env = self.blank(area, length)
        return env, env.generate(seed)

    def _rebuild(self, key: WorldKey, generated: worldgen.GeneratedWorld) -> GameEnv:
        seed, area, length = key
        env = self.blank(area, length)
        env.rebuild(seed, generated)
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
