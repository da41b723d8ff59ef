"""Crafter's world generator, whole-grid and compiled: the worlds of `crafter.worldgen`, bit for bit.

Stock crafter sets each tile with a Python call per tile and one per noise value (tens of
milliseconds a 64x64 world, numba compiling only the noise; docs/decisions/world-generator.md). Here
numba kernels that release the GIL do the whole grid, with the same floating-point operations in the
same order:

- the noise is opensimplex's own compiled `_noise3` with the arguments crafter passes (`x / size`
  after crafter's own `2 * x` or `x / 5`, an integer z), one field at a time over the tiles where
  crafter evaluates it; the permutation is opensimplex's `_init`, recompiled;
- `np.exp` is applied by numpy to the whole grid between two kernels: numpy's exp (what crafter's
  `np.exp(-start)` calls, SIMD on CPUs with AVX-512) and libm's differ in the last bit now and then;
- crafter draws `world.random.uniform()` lazily inside its `and` chains, so whether a tile draws
  depends on its terrain. The kernels draw in the same places and order, from the world's own
  RandomState: numpy's MT19937 `next_double` (what `uniform()` returns) called through numpy's
  ctypes interface on that generator's state, so it ends where crafter leaves it and every later
  step of the world draws the same numbers.

The objects (cows, zombies, skeletons) are then made by crafter's own classes and `World.add`, in
crafter's order. Under NUMBA_DISABLE_JIT the same code runs as plain Python. The tests and
`python -m benchmarks.worldgen_check` compare complete states and 1,000 steps with crafter's.
"""

from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from crafter import constants
from opensimplex.internals import _noise3

from .jit import compiled

_ID = {name: index + 1 for index, name in enumerate(constants.materials)}  # World._mat_ids
_WATER, _GRASS, _STONE, _PATH, _SAND, _TREE, _LAVA, _COAL, _IRON, _DIAMOND = (
    _ID[name] for name in ("water", "grass", "stone", "path", "sand", "tree", "lava", "coal", "iron", "diamond")
)
COW, ZOMBIE, SKELETON = 0, 1, 2  # the kinds of `generate`'s creature rows
# Crafter's normalising divisor of the mountain noise, `sum(sizes.values())` as Python computes it.
_MOUNTAIN_NORM = float(sum({15: 1, 5: 0.3}.values()))


@compiled
def _permutation(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """opensimplex's `_init(seed)`: the permutation and the 3D gradient index (int64 wrap-around kept)."""
    perm = np.zeros(256, dtype=np.int64)
    grad = np.zeros(256, dtype=np.int64)
    source = np.arange(256).astype(np.int64)
    state = np.full(1, seed, dtype=np.int64)  # an array: wraps silently, compiled or not
    for _ in range(3):
        state = state * 6364136223846793005 + 1442695040888963407
    for i in range(255, -1, -1):
        state = state * 6364136223846793005 + 1442695040888963407
        span = i + 1
        r = (state[0] % span + 31 % span) % span  # (seed + 31) % (i + 1) without overflowing seed + 31
        perm[i] = source[r]
        grad[i] = (perm[i] % 24) * 3  # len(GRADIENTS3) / 3 == 24
        source[r] = source[i]
    return perm, grad


# The noise fields crafter reads, as `_simplex(x, y, z, size)` calls: crafter passes `x / size` (after
# its own `2 * x` or `x / 5` for the tunnels) and an integer z. Row: z, x factor, x divisors, y factor,
# y divisors; the coordinate is `factor * x / divisor / divisor2` (a division by 1 is exact).
_FIELDS = np.array(
    [
        (8, 1, 3, 1, 1, 3, 1),  # start: simplex(x, y, 8, 3)
        (3, 1, 15, 1, 1, 15, 1),  # water: simplex(x, y, 3, {15: 1, 5: 0.15}, False)
        (3, 1, 5, 1, 1, 5, 1),
        (0, 1, 15, 1, 1, 15, 1),  # mountain: simplex(x, y, 0, {15: 1, 5: 0.3})
        (0, 1, 5, 1, 1, 5, 1),
        (6, 1, 7, 1, 1, 7, 1),  # cave: simplex(x, y, 6, 7)
        (7, 2, 3, 1, 1, 5, 3),  # horizontal tunnel: simplex(2 * x, y / 5, 7, 3)
        (7, 1, 5, 3, 2, 3, 1),  # vertical tunnel: simplex(x / 5, 2 * y, 7, 3)
        (1, 1, 8, 1, 1, 8, 1),  # coal: simplex(x, y, 1, 8)
        (2, 1, 6, 1, 1, 6, 1),  # iron: simplex(x, y, 2, 6)
        (6, 1, 5, 1, 1, 5, 1),  # lava: simplex(x, y, 6, 5)
        (4, 1, 9, 1, 1, 9, 1),  # sand: simplex(x, y, 4, 9)
        (5, 1, 7, 1, 1, 7, 1),  # tree: simplex(x, y, 5, 7)
    ],
    dtype=np.int64,
)
_START, _WATER15, _WATER5, _MOUNTAIN15, _MOUNTAIN5, _CAVE, _HTUNNEL, _VTUNNEL = range(8)
_COAL_NOISE, _IRON_NOISE, _LAVA_NOISE, _SAND_NOISE, _TREE_NOISE = range(8, 13)


@compiled
def _fill(out: np.ndarray, perm: np.ndarray, grad: np.ndarray, spec: np.ndarray, mask: np.ndarray) -> None:
    """One noise field (a row of _FIELDS) on the tiles of `mask`; neighbouring tiles share branches."""
    z, x_factor, x_div, x_div2, y_factor, y_div, y_div2 = spec[0], spec[1], spec[2], spec[3], spec[4], spec[5], spec[6]
    width, height = mask.shape
    for x in range(width):
        for y in range(height):
            if mask[x, y]:
                out[x, y] = _noise3(x_factor * x / x_div / x_div2, y_factor * y / y_div / y_div2, z, perm, grad)


@compiled
def _start_exponents(perm: np.ndarray, grad: np.ndarray, width: int, height: int, px: int, py: int) -> np.ndarray:
    """`-start` of every tile before crafter's sigmoid: -(4 - dist + 2 * simplex(x, y, 8, 3))."""
    noise = np.zeros((width, height), dtype=np.float64)
    _fill(noise, perm, grad, _FIELDS[_START], np.ones((width, height), dtype=np.bool_))
    out = np.empty((width, height), dtype=np.float64)
    for x in range(width):
        for y in range(height):
            start = 4 - math.sqrt((x - px) ** 2 + (y - py) ** 2)
            start += 2 * noise[x, y]
            out[x, y] = -start
    return out


@compiled
def _fill_water_and_mountain(noise: np.ndarray, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Crafter's `water` and `mountain` of every tile, from their noise fields and `start`."""
    width, height = start.shape
    water = np.zeros((width, height), dtype=np.float64)
    mountain = np.zeros((width, height), dtype=np.float64)
    for x in range(width):
        for y in range(height):
            wet = 0.0 + 1 * noise[_WATER15, x, y]
            wet += 0.15 * noise[_WATER5, x, y]
            wet = wet + 0.1
            wet -= 2 * start[x, y]
            high = 0.0 + 1 * noise[_MOUNTAIN15, x, y]
            high += 0.3 * noise[_MOUNTAIN5, x, y]
            high /= _MOUNTAIN_NORM
            high -= 4 * start[x, y] + 0.3 * wet
            water[x, y], mountain[x, y] = wet, high
    return water, mountain


@compiled
def _ore(noise: np.ndarray, mountain: float, next_double: Any, state: int) -> int:
    """The end of crafter's mountain chain, where it draws: coal, iron, diamond, lava or stone."""
    if noise[_COAL_NOISE] > 0 and next_double(state) > 0.85:
        return _COAL
    if noise[_IRON_NOISE] > 0.4 and next_double(state) > 0.75:
        return _IRON
    if mountain > 0.18 and next_double(state) > 0.994:
        return _DIAMOND
    if mountain > 0.3 and noise[_LAVA_NOISE] > 0.35:
        return _LAVA
    return _STONE


@compiled
def _terrain(
    perm: np.ndarray, grad: np.ndarray, exponentials: np.ndarray, next_double: Any, state: int
) -> tuple[np.ndarray, np.ndarray]:
    """Crafter's `_set_material` over the grid: the materials and the tunnels.

    The branches that do not draw are decided for the whole grid at once, each noise field computed
    only where crafter evaluates it; the tiles that draw (ores, trees) are then decided in crafter's
    order, x outer, y inner.
    """
    width, height = exponentials.shape
    noise = np.zeros((len(_FIELDS), width, height), dtype=np.float64)
    start = 1 / (1 + exponentials)
    land = start <= 0.5  # elsewhere the tile is grass and crafter's other noise values go unused
    for field in (_WATER15, _WATER5, _MOUNTAIN15, _MOUNTAIN5):
        _fill(noise[field], perm, grad, _FIELDS[field], land)
    water, mountain = _fill_water_and_mountain(noise, start)
    mountains = land & (mountain > 0.15)
    _fill(noise[_CAVE], perm, grad, _FIELDS[_CAVE], mountains & (mountain > 0.3))
    cave = mountains & (noise[_CAVE] > 0.15) & (mountain > 0.3)
    _fill(noise[_HTUNNEL], perm, grad, _FIELDS[_HTUNNEL], mountains & ~cave)
    horizontal = mountains & ~cave & (noise[_HTUNNEL] > 0.4)
    _fill(noise[_VTUNNEL], perm, grad, _FIELDS[_VTUNNEL], mountains & ~cave & ~horizontal)
    tunnels = horizontal | (mountains & ~cave & ~horizontal & (noise[_VTUNNEL] > 0.4))
    ores = mountains & ~cave & ~tunnels
    _fill(noise[_COAL_NOISE], perm, grad, _FIELDS[_COAL_NOISE], ores)
    _fill(noise[_IRON_NOISE], perm, grad, _FIELDS[_IRON_NOISE], ores)
    _fill(noise[_LAVA_NOISE], perm, grad, _FIELDS[_LAVA_NOISE], ores & (mountain > 0.3))
    lowland = land & ~mountains
    _fill(noise[_SAND_NOISE], perm, grad, _FIELDS[_SAND_NOISE], lowland & (0.25 < water) & (water <= 0.35))
    sand = lowland & (0.25 < water) & (water <= 0.35) & (noise[_SAND_NOISE] > -0.2)
    lake = lowland & ~sand & (0.3 < water)
    grassland = lowland & ~sand & ~lake
    _fill(noise[_TREE_NOISE], perm, grad, _FIELDS[_TREE_NOISE], grassland)
    materials = np.full((width, height), _GRASS, dtype=np.uint8)
    for x in range(width):
        for y in range(height):
            if cave[x, y] or tunnels[x, y]:
                materials[x, y] = _PATH
            elif ores[x, y]:
                materials[x, y] = _ore(noise[:, x, y], mountain[x, y], next_double, state)
            elif sand[x, y]:
                materials[x, y] = _SAND
            elif lake[x, y]:
                materials[x, y] = _WATER
            elif grassland[x, y] and noise[_TREE_NOISE, x, y] > 0 and next_double(state) > 0.8:
                materials[x, y] = _TREE
    return materials, tunnels


@compiled
def _creatures(
    materials: np.ndarray, tunnels: np.ndarray, px: int, py: int, next_double: Any, state: int
) -> np.ndarray:
    """Crafter's `_set_object` over the grid: rows (kind, x, y), in crafter's order."""
    width, height = materials.shape
    found = np.empty((width * height, 3), dtype=np.int64)
    count = 0
    for x in range(width):
        for y in range(height):
            material = materials[x, y]
            if material != _GRASS and material != _SAND and material != _PATH:
                continue
            dist = math.sqrt((x - px) ** 2 + (y - py) ** 2)
            if dist > 3 and material == _GRASS and next_double(state) > 0.985:
                kind = COW
            elif dist > 10 and next_double(state) > 0.993:
                kind = ZOMBIE
            elif material == _PATH and tunnels[x, y] and next_double(state) > 0.95:
                kind = SKELETON
            else:
                continue
            found[count, 0], found[count, 1], found[count, 2] = kind, x, y
            count += 1
    return found[:count]


@functools.cache
def _next_double() -> Any:
    """numpy's `next_double` of MT19937 (what `RandomState.uniform()` draws), callable from numba
    through numpy's documented ctypes interface of its bit generators."""
    return ctypes.cast(np.random.MT19937(0).ctypes.next_double, ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_uint64))


@dataclass(frozen=True, slots=True)
class GeneratedWorld:
    """What generating a world computed, enough to build the same world again without the noise: the
    material map, the creatures in crafter's order, and the world's RNG state when the reset ended."""

    materials: np.ndarray  # read-only
    creatures: np.ndarray  # rows (kind, x, y), read-only; kind is COW, ZOMBIE or SKELETON
    random_state: dict[str, Any]  # `RandomState.get_state(legacy=False)`


def generate(
    area: tuple[int, int], player: tuple[int, int], random: np.random.RandomState
) -> tuple[np.ndarray, np.ndarray]:
    """The computation of `crafter.worldgen.generate_world(world, player)` for a world of `area`, the
    player at `player`, drawing from the world's `random` as crafter does and leaving it in the state
    crafter leaves it in. Returns the materials (crafter's material ids) and the creatures to add, in
    crafter's order, as rows (kind, x, y)."""
    perm, grad = _permutation(random.randint(0, 2**31 - 1))
    width, height = area
    px, py = player
    exponentials = np.exp(_start_exponents(perm, grad, width, height, px, py))
    # The kernels draw from a copy of the generator's state, through numpy's public interfaces, and
    # the state they end in is handed back: the same draws `random.uniform()` would have made.
    state = random.get_state(legacy=False)
    bits = np.random.MT19937(0)
    bits.state = {"bit_generator": state["bit_generator"], "state": state["state"]}
    next_double, address = _next_double(), bits.ctypes.state_address
    materials, tunnels = _terrain(perm, grad, exponentials, next_double, address)
    creatures = _creatures(materials, tunnels, px, py, next_double, address)
    random.set_state({**state, "state": bits.state["state"]})
    materials.flags.writeable = creatures.flags.writeable = False
    return materials, creatures
