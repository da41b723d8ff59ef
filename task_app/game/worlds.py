"""World creation and the bounded cache of generated worlds.

A world is a `GameEnv` after `reset()`: identical to stock `crafter.Env(area=, length=, seed=)` after
`reset()`. `worldgen` generates it with compiled whole-grid code (a few milliseconds, the GIL released
for most of it); each generated world is also kept as a pickled snapshot (immutable bytes; 32-37 KB
for a 64x64 world, measured over seeds 0-19) keyed by (seed, area, length), and a repeated seed
unpickles its snapshot in a fraction of a millisecond (benchmarks/world.py). Every restore is a new
object graph, so two rollouts on one seed never share mutable state.

The textures (read-only PNG data, ~25 ms to load per `crafter.Env()`) are shared by all worlds
through pickle's persistent ids instead of being loaded or copied per world.
"""

from __future__ import annotations

import io
import pickle
import threading
from typing import Any

import crafter
import numpy as np
from crafter import engine

from ..core.lru import LruMap
from . import worldgen

_TEXTURES_ID = "crafter-textures"


class GameEnv(crafter.Env):
    """`crafter.Env` that renders a frame only when asked.

    Stock `Env.step()` renders the frame every step, and at night that render draws noise from the
    world's RNG. `_obs` keeps exactly that RNG draw (so trajectories equal stock crafter's) without
    paying for the picture; `frame()` renders on demand with the world RNG left untouched.
    """

    _last_health: Any  # crafter's own attribute (set by reset and step); typed for the checker

    def _obs(self) -> None:
        if self._world.daylight < 0.5:  # crafter's night threshold in LocalView._light
            unit = self._size // self._view
            shape = tuple(int(v) for v in self._local_view._grid * unit)
            self._world.random.uniform(32, 127, shape)

    def _balance_chunk(self, chunk: Any, objs: Any) -> None:
        # Stock crafter picks the creature to despawn by index into a list built from a *set* of
        # objects, whose order follows memory addresses: the same seed and actions can then give
        # different worlds. Ordering the chunk's objects by position makes the choice reproducible.
        super()._balance_chunk(chunk, sorted(objs, key=lambda obj: (int(obj.pos[0]), int(obj.pos[1]))))

    def step(self, action: int) -> tuple[None, float, bool, dict[str, Any]]:
        """Stock `Env.step` with the same effects on the world, minus the work the app never reads.

        Stock crafter builds an `info` dict every step (inventory and achievement copies, a semantic
        map; here it is empty) and measures each object's distance to the player with numpy calls per
        object. Here the distances are array operations: objects only ever move themselves, at their
        own turn, and only the player's turn moves the player, so the objects before the player (none:
        reset adds it first) are measured against where it stood and those after it against where its
        update left it, which is what stock crafter measures. (benchmarks.worldgen_check steps both.)
        """
        self._step += 1
        self._update_time()
        player = self._player
        player.action = crafter.constants.actions[action]
        objects = self._world.objects
        first = objects.index(player)
        positions = np.array([obj.pos for obj in objects])
        reach = 2 * max(self._view)
        for start, stop in ((0, first), (first, first + 1), (first + 1, len(objects))):
            near = np.abs(positions[start:stop] - player.pos).sum(axis=1) < reach
            for obj, close in zip(objects[start:stop], near.tolist(), strict=True):
                if close:
                    obj.update()
        if self._step % 10 == 0:
            for chunk, objs in self._world.chunks.items():
                self._balance_chunk(chunk, objs)
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


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, textures: engine.Textures) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._textures = textures

    def persistent_id(self, obj: object) -> str | None:
        return _TEXTURES_ID if obj is self._textures else None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, textures: engine.Textures) -> None:
        super().__init__(file)
        self._textures = textures

    def persistent_load(self, pid: object) -> engine.Textures:
        if pid != _TEXTURES_ID:
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        return self._textures


WorldKey = tuple[int, tuple[int, int], int]


class WorldFactory:
    """Builds worlds, restoring cached snapshots of seeds generated before. Thread-safe."""

    def __init__(self, cache_size: int = 512) -> None:
        self._snapshots: LruMap[WorldKey, bytes] = LruMap(cache_size)
        self._blanks: dict[tuple[tuple[int, int], int], bytes] = {}
        self._lock = threading.Lock()
        self._generating: dict[WorldKey, threading.Lock] = {}  # one generation per new world at a time
        self._textures = engine.Textures(crafter.constants.root / "assets")
        self.hits = 0
        self.misses = 0

    def _dumps(self, env: GameEnv) -> bytes:
        buffer = io.BytesIO()
        _Pickler(buffer, self._textures).dump(env)
        return buffer.getvalue()

    def _loads(self, data: bytes) -> GameEnv:
        env: GameEnv = _Unpickler(io.BytesIO(data), self._textures).load()
        return env

    def _blank(self, area: tuple[int, int], length: int) -> GameEnv:
        """A constructed, not yet reset env (textures shared) for (area, length)."""
        with self._lock:
            blank = self._blanks.get((area, length))
            if blank is None:
                env = GameEnv(area=area, length=length, seed=0)
                env._textures = self._textures
                env._local_view._textures = self._textures
                env._item_view._textures = self._textures
                blank = self._blanks[(area, length)] = self._dumps(env)
        return self._loads(blank)

    def blank(self, area: tuple[int, int], length: int) -> GameEnv:
        """A constructed, never reset env (textures shared): what a checkpoint is loaded into."""
        return self._blank((area[0], area[1]), length)

    def generate(self, seed: int, area: tuple[int, int], length: int) -> GameEnv:
        """A freshly generated world, bypassing the cache."""
        env = self._blank(area, length)
        env._seed = seed
        worldgen.reset(env)
        return env

    def world(self, seed: int, area: tuple[int, int] = (64, 64), length: int = 10_000) -> GameEnv:
        """The world for `seed` right after reset: from the cache, or generated and cached. Concurrent
        requests for one new world (a GRPO group) wait for one generation and restore it after."""
        key: WorldKey = (seed, (area[0], area[1]), length)
        snapshot = self._cached(key)
        if snapshot is not None:
            return self._loads(snapshot)
        with self._lock:
            gate = self._generating.setdefault(key, threading.Lock())
        with gate:
            snapshot = self._cached(key)
            if snapshot is not None:
                return self._loads(snapshot)
            env = self.generate(seed, area, length)
            if self._snapshots.max_items:
                data = self._dumps(env)
                with self._lock:
                    self.misses += 1
                    self._snapshots.put(key, data)
        with self._lock:
            if self._generating.get(key) is gate:
                del self._generating[key]
        return env

    def _cached(self, key: WorldKey) -> bytes | None:
        with self._lock:
            snapshot = self._snapshots.get(key)
            if snapshot is not None:
                self.hits += 1
        return snapshot

    def __len__(self) -> int:
        return len(self._snapshots)
