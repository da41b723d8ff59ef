"""Map analysis and routes for the scripted policy: where to walk, where to hide, where to plant.

The policy asks several route questions per decision (nearest water, tree, table, shelter, ...) and
each must cost well under a millisecond on the event loop, so:

- the map is flattened into a plain list with a one-tile blocked border: a neighbour is
  `cell + offset`, with no bounds checks (list indexing is much faster than numpy per-cell access);
- routes come from Dial's algorithm (Dijkstra with cost buckets): a step onto grass, sand or path
  costs one action, a step into a tile we must chop or mine first costs three (turn to face it,
  `do`, move in), and tiles near zombies or in a skeleton's line of fire cost extra;
- a search stops at its first goal and at `max_cost`, so an unreachable goal costs a bounded scan;
- whole-map questions (where are shelter sites, nooks for a sapling) are numpy masks.

Crafter rules used here (crafter/objects.py, env.py): `move_*` always turns the player and moves
only onto a free walkable tile; `do` and `place_*` act on the faced tile; zombies walk on grass,
sand and path and hit what is next to them (Manhattan distance 1); skeletons shoot arrows along a
straight line at players within 5 tiles, and arrows fly over grass, sand, path, water and lava.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..game.observation import SEMANTIC_IDS, SEMANTIC_NAMES

DIRECTIONS: tuple[tuple[int, int], ...] = ((-1, 0), (1, 0), (0, -1), (0, 1))
MOVES: tuple[str, ...] = ("move_left", "move_right", "move_up", "move_down")
MOVE_INDEX: dict[str, int] = {name: index for index, name in enumerate(MOVES)}
OPPOSITE: tuple[int, ...] = (1, 0, 3, 2)
BLOCKED, WALK_COST, DIG_COST = 0, 1, 3
GROUND: tuple[str, ...] = ("grass", "sand", "path")  # where the player, zombies and skeletons walk
# Route tiles: arrows vanish within a step or two, and the player's own tile is free.
WALKABLE: tuple[str, ...] = (*GROUND, "arrow", "player")
# Tiles no zombie can enter. Lava also stops them but is never a wall we choose to sit next to.
WALLS: tuple[str, ...] = ("water", "stone", "tree", "coal", "iron", "diamond", "table", "furnace")
CREATURES: tuple[str, ...] = ("zombie", "skeleton", "cow")
ARROW_GROUND: tuple[str, ...] = (*GROUND, "water", "lava", "player", "arrow", *CREATURES)
SKELETON_RANGE = 5
# Route penalties (in actions): (kind, radius, cost); zombies hit from one tile away.
DANGER: tuple[tuple[str, int, int], ...] = (("zombie", 1, 6), ("zombie", 2, 3))
FIRE_COST = 4

Goal = Callable[[int, int], list[str] | None]


def ids_of(names: Iterable[str]) -> list[int]:
    return [SEMANTIC_IDS[name] for name in names]


@functools.lru_cache(maxsize=256)
def _lookup(names: tuple[str, ...]) -> np.ndarray:
    table = np.zeros(len(SEMANTIC_NAMES), dtype=bool)
    table[ids_of(names)] = True
    table.flags.writeable = False
    return table


def mask_of(semantic: np.ndarray, names: Iterable[str]) -> np.ndarray:
    """Boolean [x, y] mask of the tiles showing any of `names` (a table lookup: np.isin is slower)."""
    mask: np.ndarray = _lookup(tuple(names))[semantic]
    return mask


def shifted(mask: np.ndarray, dx: int, dy: int) -> np.ndarray:
    """`out[x, y] = mask[x + dx, y + dy]`, zero beyond the map."""
    out = np.zeros_like(mask)
    width, height = mask.shape
    source = mask[max(0, dx) : width + min(0, dx), max(0, dy) : height + min(0, dy)]
    out[max(0, -dx) : width - max(0, dx), max(0, -dy) : height - max(0, dy)] = source
    return out


def spread(mask: np.ndarray, radius: int = 1) -> np.ndarray:
    """Tiles within Manhattan `radius` of a masked tile."""
    for _ in range(radius):
        mask = mask | shifted(mask, 1, 0) | shifted(mask, -1, 0) | shifted(mask, 0, 1) | shifted(mask, 0, -1)
    return mask


def chebyshev_ring(mask: np.ndarray) -> np.ndarray:
    """Tiles whose 3x3 neighbourhood holds a masked tile: where `make_*` sees a table (world.nearby(pos, 1))."""
    out = np.zeros_like(mask)
    for dx in (-1, 0, 1):
        for dy in (-1, 0, 1):
            out |= shifted(mask, dx, dy)
    return out


def single(shape: tuple[int, ...], position: tuple[int, int]) -> np.ndarray:
    mask = np.zeros(shape, dtype=bool)
    mask[position] = True
    return mask


def inside(semantic: np.ndarray, position: tuple[int, int]) -> bool:
    width, height = semantic.shape
    return 0 <= position[0] < int(width) and 0 <= position[1] < int(height)


def fire_lines(semantic: np.ndarray) -> np.ndarray:
    """Tiles a skeleton can shoot now: straight lines of up to 5 tiles an arrow flies over."""
    fire = np.zeros(semantic.shape, dtype=bool)
    flies = set(ids_of(ARROW_GROUND))
    for x, y in zip(*np.nonzero(semantic == SEMANTIC_IDS["skeleton"]), strict=True):
        for dx, dy in DIRECTIONS:
            for distance in range(1, SKELETON_RANGE + 1):
                tile = (int(x) + dx * distance, int(y) + dy * distance)
                if not inside(semantic, tile) or int(semantic[tile]) not in flies:
                    break
                fire[tile] = True
    return fire


def danger(semantic: np.ndarray, fire: np.ndarray) -> np.ndarray:
    """Extra route cost per tile: next to zombies, and in a skeleton's line of fire."""
    penalty = fire.astype(np.int8) * FIRE_COST
    for name, radius, cost in DANGER:
        near = mask_of(semantic, (name,))
        if near.any():
            penalty += spread(near, radius).astype(np.int8) * cost
    return penalty


def enclosed(semantic: np.ndarray, position: tuple[int, int], limit: int = 3) -> bool:
    """No zombie can reach us: the open region around the player is at most `limit` tiles, hostile-free."""
    closed = set(ids_of((*WALLS, "lava")))
    region, frontier = {position}, [position]
    while frontier:
        x, y = frontier.pop()
        for dx, dy in DIRECTIONS:
            tile = (x + dx, y + dy)
            if tile in region or not inside(semantic, tile) or int(semantic[tile]) in closed:
                continue
            region.add(tile)
            frontier.append(tile)
            if len(region) > limit:
                return False
    hostile = set(ids_of(("zombie", "skeleton")))
    return not any(int(semantic[tile]) in hostile for tile in region)


class Grid:
    """One decision's map as a flat cost list, plus the player's tile and facing."""

    def __init__(
        self,
        semantic: np.ndarray,
        position: tuple[int, int],
        facing: tuple[int, int],
        diggable: Iterable[str] = (),
        penalty: np.ndarray | None = None,
        unsafe: np.ndarray | None = None,
        blocked: np.ndarray | None = None,
    ) -> None:
        width, height = semantic.shape
        self.shape: tuple[int, int] = (int(width), int(height))
        self.stride = int(height) + 2
        self.offsets: tuple[int, ...] = (-self.stride, self.stride, -1, 1)  # the order of DIRECTIONS
        table = np.zeros(len(SEMANTIC_NAMES), dtype=np.int8)
        table[ids_of(WALKABLE)] = WALK_COST
        table[ids_of(diggable)] = DIG_COST
        cost = table[semantic]
        if penalty is not None:
            cost = np.where(cost > 0, cost + penalty, 0).astype(np.int8)
        if blocked is not None:
            cost = np.where(blocked, 0, cost).astype(np.int8)
        self.cost: list[int] = self.flat(cost)
        self.walkable: list[bool] = self.flat(mask_of(semantic, WALKABLE))
        self.unsafe: list[bool] | None = self.flat(unsafe) if unsafe is not None and unsafe.any() else None
        self.start = self.index(position)
        self.facing = DIRECTIONS.index(facing if facing in DIRECTIONS else (0, 1))  # crafter starts facing down

    def index(self, position: Sequence[int]) -> int:
        return (int(position[0]) + 1) * self.stride + int(position[1]) + 1

    def position(self, index: int) -> tuple[int, int]:
        x, y = divmod(index, self.stride)
        return x - 1, y - 1

    def flat(self, mask: np.ndarray) -> list[Any]:
        """An [x, y] array in this grid's flat indexing (the border is 0/False)."""
        padded = np.zeros((self.shape[0] + 2, self.shape[1] + 2), dtype=mask.dtype)
        padded[1:-1, 1:-1] = mask
        return padded.ravel().tolist()

    def free(self, index: int) -> bool:
        return self.cost[index] > BLOCKED and self.walkable[index]

    def search(self, goal: Goal, max_cost: int, risky: bool = False) -> list[str] | None:
        """Actions along the cheapest route to the first cell where `goal(cell, arrival)` answers.

        `arrival` is the direction index of the last move into the cell (the player's facing at the
        start); `goal` returns the actions to append there, or None to search on. Unless `risky`,
        a goal never lies on an unsafe tile (one a skeleton can shoot along).
        """
        cost, (left, right, up, down) = self.cost, self.offsets
        unsafe = None if risky else self.unsafe
        limit = max_cost + 1
        best = [limit] * len(cost)
        best[self.start] = 0
        arrival, parent = {self.start: self.facing}, {self.start: -1}
        buckets: list[list[int]] = [[] for _ in range(limit)]
        buckets[0].append(self.start)
        for level, bucket in enumerate(buckets):
            for cell in bucket:
                if best[cell] != level:
                    continue
                tail = None if unsafe is not None and unsafe[cell] else goal(cell, arrival[cell])
                if tail is not None:
                    return self._route(cell, parent, arrival) + tail
                for direction, neighbour in enumerate((cell + left, cell + right, cell + up, cell + down)):
                    step = cost[neighbour]
                    if step and level + step < best[neighbour]:
                        best[neighbour], parent[neighbour], arrival[neighbour] = level + step, cell, direction
                        buckets[level + step].append(neighbour)
        return None

    def _route(self, cell: int, parent: dict[int, int], arrival: dict[int, int]) -> list[str]:
        steps: list[int] = []
        while cell != self.start:
            steps.append(cell)
            cell = parent[cell]
        actions: list[str] = []
        for step in reversed(steps):
            move = MOVES[arrival[step]]
            actions += [move] if self.walkable[step] else [move, "do", move]
        return actions

    def face(self, target: np.ndarray, then: Sequence[str], max_cost: int, risky: bool = False) -> list[str] | None:
        """Walk next to a `target` tile, turn to it, then `then` (the target must not be walkable)."""
        flat, offsets = self.flat(target), self.offsets

        def goal(cell: int, arrival: int) -> list[str] | None:
            for direction in (arrival, 0, 1, 2, 3):
                if flat[cell + offsets[direction]]:
                    return [MOVES[direction], *then]
            return None

        return self.search(goal, max_cost, risky)

    def stand(self, spot: np.ndarray, then: Sequence[str], max_cost: int) -> list[str] | None:
        """Walk onto any `spot` tile, then `then`."""
        flat = self.flat(spot)
        return self.search(lambda cell, _arrival: list(then) if flat[cell] else None, max_cost)

    def turn_to(self, cell: int, arrival: int, direction: int) -> list[str] | None:
        """Moves that leave the player on `cell` facing `direction` without leaving it for good.

        Facing a free tile needs the last move to point at it: from any other facing we step back
        (onto a free tile behind) and forth.
        """
        if direction == arrival:
            return []
        back = OPPOSITE[direction]
        return [MOVES[back], MOVES[direction]] if self.free(cell + self.offsets[back]) else None

    def face_open(
        self, spot: np.ndarray, then: Sequence[str], max_cost: int, stand: np.ndarray | None = None
    ) -> list[str] | None:
        """Stand (on a `stand` tile, if given) facing a free `spot` tile without stepping onto it."""
        flat, offsets = self.flat(spot), self.offsets
        allowed = self.flat(stand) if stand is not None else None

        def goal(cell: int, arrival: int) -> list[str] | None:
            if allowed is not None and not allowed[cell]:
                return None
            for direction in (arrival, 0, 1, 2, 3):
                turn = self.turn_to(cell, arrival, direction) if flat[cell + offsets[direction]] else None
                if turn is not None:
                    return [*turn, *then]
            return None

        return self.search(goal, max_cost)


def safe_prefix(actions: Sequence[str], position: tuple[int, int], deadly: np.ndarray) -> list[str]:
    """Cut the plan before any move that could step onto a deadly tile (lava).

    A move fails when something (a cow, a zombie) blocks it, and every later move then starts one
    tile off the planned route; so we track every position the plan could be in.
    """
    possible = {position}
    for index, action in enumerate(actions):
        direction = MOVE_INDEX.get(action)
        if direction is None:
            continue
        dx, dy = DIRECTIONS[direction]
        moved = {(x + dx, y + dy) for x, y in possible}
        if any(inside(deadly, tile) and deadly[tile] for tile in moved):
            return list(actions[:index])
        possible |= moved
    return list(actions)


# --- shelters ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Shelter:
    """A two-tile pocket: from `entry` walk (or dig) `direction` through two tiles, then plug `entry`.

    Facing only turns with a move, and a move onto a free tile leaves it, so one can never face the
    tile one came from. Hence two tiles: standing in the inner one we face beyond it (plugging it if
    it is open); stepping back to the middle one we face the entry, the one opening left, and plug it.
    """

    entry: tuple[int, int]
    direction: int

    def tile(self, steps: int) -> tuple[int, int]:
        dx, dy = DIRECTIONS[self.direction]
        return self.entry[0] + steps * dx, self.entry[1] + steps * dy

    def actions(self, grid: Grid, semantic: np.ndarray, diggable: Sequence[str], max_cost: int) -> list[str]:
        """What to do from where the player stands, or [] if the pocket cannot be finished from there."""
        move, back = MOVES[self.direction], MOVES[OPPOSITE[self.direction]]
        middle, inner = self.tile(1), self.tile(2)
        front = [] if _shows(semantic, self.tile(3), WALLS) else ["place_stone"]
        plug = ["place_stone"] if _shows(semantic, self.entry, GROUND) else []

        def enter(tile: tuple[int, int]) -> list[str]:
            return [move, "do", move] if _shows(semantic, tile, diggable) else [move]

        outside = [*enter(middle), *enter(inner), *front, back, "place_stone"]
        position, facing = grid.position(grid.start), grid.facing
        if position == inner:
            if front and facing != self.direction:  # step back and in again to face the open end
                return [back, move, *front, back, *plug]
            return [*front, back, *plug]
        if position == middle:
            if facing == OPPOSITE[self.direction]:
                return plug
            if facing == self.direction:
                return [*enter(inner), *front, back, *plug]
            if not plug:
                return [back]  # the entry is closed already: just turn to it
            return [back, *outside]  # facing a side wall: go out to the entry and come in straight
        return grid.stand(single(semantic.shape, self.entry), outside, max_cost) or []


def _shows(semantic: np.ndarray, position: tuple[int, int], names: Iterable[str]) -> bool:
    return inside(semantic, position) and int(semantic[position]) in ids_of(names)


def _exposed(semantic: np.ndarray) -> list[np.ndarray]:
    """Per direction e, tiles P with water at P + e and, up to 5 tiles on over water or lava, ground
    a skeleton could stand on: its arrow would cross the water into a pocket at P."""
    water = mask_of(semantic, ("water",))
    passable = mask_of(semantic, ARROW_GROUND)
    ground = mask_of(semantic, (*GROUND, *CREATURES))
    exposed = []
    for dx, dy in DIRECTIONS:
        clear = shifted(water, dx, dy)
        hit = np.zeros_like(clear)
        for distance in range(2, SKELETON_RANGE + 1):
            hit |= clear & shifted(ground, dx * distance, dy * distance)
            clear &= shifted(passable, dx * distance, dy * distance)
        exposed.append(hit)
    return exposed


def shelter_sites(semantic: np.ndarray, diggable: Sequence[str], stone: int) -> tuple[list[np.ndarray], ...]:
    """Per direction, the entries of pockets we can walk or dig into and seal with `stone` stones; and
    those with water in a wall, so we can drink inside.

    The sides of both pocket tiles and the tile beyond must be walls (beyond may be open ground if
    we have a stone for it). Water stops zombies but not arrows, so no skeleton may have a line
    across the water into the pocket.
    """
    walls = mask_of(semantic, WALLS)
    water = mask_of(semantic, ("water",))
    walk = mask_of(semantic, (*GROUND, "player"))
    enter = walk | mask_of(semantic, diggable)
    is_stone = mask_of(semantic, ("stone",)).astype(np.int16)
    plug = mask_of(semantic, (*GROUND, "water"))
    exposed = _exposed(semantic)
    sites, wet = [], []
    for direction, (dx, dy) in enumerate(DIRECTIONS):
        side = (dy, dx)
        sides = (DIRECTIONS.index(side), DIRECTIONS.index((-dy, -dx)))
        middle, inner, beyond = (dx, dy), (2 * dx, 2 * dy), (3 * dx, 3 * dy)
        site = walk & shifted(enter, *middle) & shifted(enter, *inner) & ~shifted(exposed[direction], *inner)
        drinkable = shifted(water, *beyond)
        for ox, oy in (middle, inner):
            for sx, sy in (side, (-dy, -dx)):
                site &= shifted(walls, ox + sx, oy + sy)
                drinkable |= shifted(water, ox + sx, oy + sy)
            site &= ~shifted(exposed[sides[0]], ox, oy) & ~shifted(exposed[sides[1]], ox, oy)
        open_front = ~shifted(walls, *beyond)
        site &= ~open_front | shifted(plug, *beyond)
        available = stone + shifted(is_stone, *middle) + shifted(is_stone, *inner)
        site &= available >= 1 + open_front
        sites.append(site)
        wet.append(site & drinkable)
    return sites, wet


def nearest_shelter(
    grid: Grid, sites: Sequence[np.ndarray], max_cost: int, avoid: set[tuple[int, int]]
) -> Shelter | None:
    flats = [grid.flat(site) for site in sites]
    found: list[Shelter] = []

    def goal(cell: int, _arrival: int) -> list[str] | None:
        for direction, flat in enumerate(flats):
            if flat[cell] and grid.position(cell) not in avoid:
                found.append(Shelter(grid.position(cell), direction))
                return []
        return None

    grid.search(goal, max_cost)
    return found[0] if found else None


def find_shelter(
    grid: Grid,
    semantic: np.ndarray,
    diggable: Sequence[str],
    sites: tuple[list[np.ndarray], ...],
    *,
    reach: int,
    avoid: set[tuple[int, int]],
    wet_detour: int,
    near: tuple[int, int] | None = None,
    radius: int = 0,
) -> Shelter | None:
    """The nearest of the `shelter_sites` within `radius` of `near` if any, else the nearest, or one
    with water in a wall when it costs at most `wet_detour` more actions."""
    every, wet = sites
    if near is not None:
        xs, ys = np.indices(grid.shape)
        close = np.abs(xs - near[0]) + np.abs(ys - near[1]) < radius
        found = nearest_shelter(grid, [site & close for site in every], reach, avoid)
        if found is not None:
            return found
    nearest = nearest_shelter(grid, every, reach, avoid)
    if nearest is None:
        return None
    walk = len(nearest.actions(grid, semantic, diggable, reach))
    return nearest_shelter(grid, wet, min(reach, walk + wet_detour), avoid) or nearest


# --- a garden ---------------------------------------------------------------------------------------


def nooks(semantic: np.ndarray) -> list[np.ndarray]:
    """Per direction e, tiles Z from which grass X = Z + e can take a sapling that stays walled in.

    X's other three neighbours are walls, and Z - e, Z - 2e are ground: after planting we step back
    twice and forth once to face Z, and plug it with stone. A plant dies as soon as a cow, zombie or
    skeleton stands next to it (objects.Plant.update).
    """
    walls = mask_of(semantic, WALLS)
    grass = mask_of(semantic, ("grass",))
    ground = mask_of(semantic, (*GROUND, "player"))
    found = []
    for dx, dy in DIRECTIONS:
        nook = ground & shifted(grass, dx, dy) & shifted(ground, -dx, -dy) & shifted(ground, -2 * dx, -2 * dy)
        for ox, oy in DIRECTIONS:
            if (ox, oy) != (-dx, -dy):
                nook &= shifted(walls, dx + ox, dy + oy)
        found.append(nook)
    return found


def plant_route(grid: Grid, semantic: np.ndarray, max_cost: int) -> tuple[list[str], tuple[int, int], int] | None:
    """Actions ending in `place_plant` into the nearest nook, the tile we plant from, and the direction."""
    flats = [grid.flat(nook) for nook in nooks(semantic)]
    chosen: list[int] = []

    def goal(cell: int, arrival: int) -> list[str] | None:
        for direction in (arrival, 0, 1, 2, 3):
            turn = grid.turn_to(cell, arrival, direction) if flats[direction][cell] else None
            if turn is not None:
                chosen[:] = [cell, direction]
                return [*turn, "place_plant"]
        return None

    route = grid.search(goal, max_cost)
    return (route, grid.position(chosen[0]), chosen[1]) if route else None
