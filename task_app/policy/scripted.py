"""`crafter-scripted`: the built-in baseline policy, a list of rules over the whole semantic map (no model).

Each decision walks the rules in order and plays the first that has a plan:

    keep sleeping ─► fight what is adjacent ─► stay in the shelter at night ─► shoot back
    ─► go to the shelter at night ─► drink / eat when low ─► fill up before dusk ─► rest when
    tired or hurt ─► a first zombie ─► drink / eat nearby ─► eat and guard our plant ─► the tech tree
       (wood, table, wood tools, sapling, stone, stone tools, coal, furnace, iron, iron tools,
        diamond) ─► wander

Every recipe and cost comes from crafter's own data.yaml (`crafter.constants`): in crafter 1.8.3 a
table costs wood 2, a furnace stone 4, and chopping a tree turns it into grass. Night is the main
danger: from step ~116 of each 300-step day zombies spawn on grass (up to 3 per chunk), and sleeping
is a commitment (crafter forces `sleep` until energy is full, and a zombie hits a sleeper for 7).
So at dusk the policy walls itself into a two-tile pocket (`navigation.Shelter`), preferably one
with water in a wall, sleeps and waits there until dawn. For eat_plant it plants a sapling in a nook
walled on three sides, plugs the fourth with stone, and shelters near it (plants grow only while the
player is within 18 tiles).

Deterministic: the only randomness (wandering when nothing else applies) is a `random.Random`
seeded by the constructor.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import crafter.constants
import numpy as np

from ..game import TOOL_NAME, Observation
from ..game.observation import SEMANTIC_IDS
from .base import HistoryEntry, PolicyDecision
from .navigation import (
    DIRECTIONS,
    GROUND,
    MOVES,
    Grid,
    Shelter,
    chebyshev_ring,
    danger,
    enclosed,
    find_shelter,
    fire_lines,
    inside,
    mask_of,
    plant_route,
    safe_prefix,
    shelter_sites,
    single,
)

_MAKE: dict[str, Any] = crafter.constants.make
_PLACE: dict[str, Any] = crafter.constants.place
_COLLECT: dict[str, Any] = crafter.constants.collect
MAX_VITAL = int(crafter.constants.items["energy"]["max"])
TOOLS: tuple[str, ...] = ("wood_pickaxe", "wood_sword", "stone_pickaxe", "stone_sword", "iron_pickaxe", "iron_sword")
TABLE_WOOD = int(_PLACE["table"]["uses"]["wood"])
FURNACE_STONE = int(_PLACE["furnace"]["uses"]["stone"])
STATION_GROUND: tuple[str, ...] = tuple(_PLACE["table"]["where"])
STONE_GROUND: tuple[str, ...] = tuple(name for name in _PLACE["stone"]["where"] if name != "lava")
# Creature health (crafter/objects.py) and the player's damage per sword (Player._do_object).
ZOMBIE_HEALTH, SKELETON_HEALTH, COW_HEALTH = 5, 3, 3
SWORD_DAMAGE: tuple[tuple[str, int], ...] = (("iron_sword", 8), ("stone_sword", 3), ("wood_sword", 2))
HOSTILES: tuple[str, ...] = ("zombie", "skeleton")
# A day is 300 steps (Env._update_time); zombies spawn on grass while daylight < 0.83, i.e. from
# step ~116 to ~304 of each day; we are walled in from DUSK to DAWN.
DAY_LENGTH, DUSK, DAWN = 300, 140, 5
# Fill up from DUSK - PREPARE with meals that bring us home by DUSK + PREPARE_GRACE (starving by
# dawn kills more often than a late walk home); time the walk home from DUSK - EVENING.
PREPARE, PREPARE_GRACE, EVENING, EVENING_SLACK = 50, 40, 80, 10
PLANT_RANGE = 18  # Env.step updates objects (a plant grows) only closer than 2 * max(view) = 18
RIPE_AGE, RIPE_RETRY = 330, 30  # objects.Plant.ripe is grown > 300; we count with some slack

# Vitals thresholds, and search budgets in actions.
URGENT, TOP_UP, FULL_FOOD, FULL_DRINK = 3, 6, 7, 8
REST_ENERGY, LOW_HEALTH, RECOVERED_HEALTH, HUNT_HEALTH, DESPERATE_HEALTH = 3, 3, 6, 5, 2
NEAR, REACH, FAR = 8, 30, 90
WET_DETOUR = 20  # extra actions worth walking for a shelter we can drink in
SAPLING_TRIES = 6  # `do` on grass gives a sapling with probability 0.1
PLUG_STONES = 3  # stone kept for shelter and garden plugs
STRIKE = 2  # a route of [turn, do]: the target is next to us


@dataclass(frozen=True, slots=True)
class Plan:
    goal: str
    actions: list[str]


@dataclass(slots=True)
class Garden:
    """Our walled-in plant: where it is, its plugged side, and how long it has grown."""

    plant: tuple[int, int]
    door: tuple[int, int]
    age: int = 0

    def walls(self) -> list[tuple[int, int]]:
        return [(self.plant[0] + dx, self.plant[1] + dy) for dx, dy in DIRECTIONS]


class Now:
    """One decision's view of the game: map, vitals, inventory, tools and the routing grid."""

    def __init__(self, observation: Observation, semantic: np.ndarray, garden: Garden | None) -> None:
        data = observation.data
        self.semantic = semantic
        self.position: tuple[int, int] = (int(data["player_position"][0]), int(data["player_position"][1]))
        self.facing: tuple[int, int] = (int(data["player_direction"][0]), int(data["player_direction"][1]))
        self.inventory: dict[str, int] = dict(data["inventory"])
        self.achieved = frozenset(name for name, done in data["achievements_status"].items() if done)
        self.eaten_plants = int(data.get("achievements_counts", {}).get("eat_plant", 0))
        self.step = int(data.get("num_steps_taken", 0))
        # The garden's walls are never mined for stone nor dug through (its door only on the way in).
        self.keep = np.zeros(semantic.shape, dtype=bool)
        blocked = self.keep.copy()
        if garden is not None:
            for tile in garden.walls():
                if inside(semantic, tile):
                    self.keep[tile], blocked[tile] = True, tile != garden.door
        self.fire = fire_lines(semantic)
        self.dig = self.diggable()
        self.grid = Grid(
            semantic, self.position, self.facing, self.dig, danger(semantic, self.fire), self.fire, blocked
        )

    def count(self, item: str) -> int:
        return int(self.inventory.get(item, 0))

    def diggable(self) -> list[str]:
        """Tiles a route may chop or mine through with the tools we hold."""
        names = ["tree"]
        for material in ("stone", "coal", "iron", "diamond"):
            if all(self.count(tool) >= amount for tool, amount in _COLLECT[material]["require"].items()):
                names.append(material)
        return names

    @property
    def phase(self) -> int:
        return self.step % DAY_LENGTH

    @property
    def dark(self) -> bool:
        return self.phase >= DUSK or self.phase < DAWN

    @property
    def fed(self) -> bool:
        return min(self.count("food"), self.count("drink")) > URGENT

    def hits(self, health: int) -> int:
        damage = next((damage for sword, damage in SWORD_DAMAGE if self.count(sword)), 1)
        return -(-health // damage)

    def mask(self, *names: str) -> np.ndarray:
        return mask_of(self.semantic, names)

    def targets(self, name: str) -> np.ndarray:
        """Tiles of `name` we may chop or mine."""
        return self.mask(name) & ~self.keep

    def shows(self, position: tuple[int, int], names: Sequence[str]) -> bool:
        return inside(self.semantic, position) and int(self.semantic[position]) in [SEMANTIC_IDS[n] for n in names]

    def adjacent(self, names: Sequence[str]) -> int | None:
        """Direction index of an adjacent tile showing one of `names`."""
        for direction, (dx, dy) in enumerate(DIRECTIONS):
            if self.shows((self.position[0] + dx, self.position[1] + dy), names):
                return direction
        return None

    def enclosed(self) -> bool:
        return enclosed(self.semantic, self.position)

    @functools.cached_property
    def sites(self) -> tuple[list[np.ndarray], ...]:
        """Shelter sites (all, and with water in a wall), computed at most once per decision."""
        return shelter_sites(self.semantic, self.dig, self.count("stone"))


def _affordable(recipe: dict[str, int], inventory: dict[str, int]) -> bool:
    return all(inventory.get(item, 0) >= amount for item, amount in recipe.items())


def _craftable(now: Now, stations: tuple[str, ...]) -> list[str]:
    """Missing tools made at `stations` that we can afford, in order, each paid from what the earlier left."""
    inventory = dict(now.inventory)
    chosen = []
    for tool in TOOLS:
        info = _MAKE[tool]
        if inventory.get(tool, 0) or tuple(info["nearby"]) != stations or not _affordable(info["uses"], inventory):
            continue
        for item, amount in info["uses"].items():
            inventory[item] -= amount
        chosen.append(tool)
    return chosen


def _stand_for(now: Now, stations: tuple[str, ...]) -> np.ndarray:
    """Where to stand to craft at `stations`: each within the 3x3 around the player (world.nearby)."""
    stand = np.ones(now.semantic.shape, dtype=bool)
    for station in stations:
        stand &= chebyshev_ring(now.mask(station))
    return stand


def _missing(now: Now, item: str) -> int:
    """How much of `item` the tools we still lack will use."""
    return sum(_MAKE[tool]["uses"].get(item, 0) for tool in TOOLS if not now.count(tool))


class ScriptedPolicy:
    """The rule-based baseline; see the module docstring for the rule order."""

    name = "crafter-scripted"

    def __init__(self, max_actions: int = 8, seed: int = 0) -> None:
        self.max_actions = max_actions
        self._random = random.Random(seed)
        self._asleep = False
        self._recovering = False
        self._last_health = MAX_VITAL
        self._last: tuple[tuple[int, int], tuple[int, int], str, int] | None = None  # pose, goal, actions
        self._ground: np.ndarray | None = None
        self._shelter: Shelter | None = None
        self._bad_entries: set[tuple[int, int]] = set()
        self._garden: Garden | None = None
        self._eaten_plants = 0
        self._rules: tuple[Callable[[Now], Plan | None], ...] = (
            self._keep_sleeping,
            self._fight,
            self._stay_in,
            self._shoot_back,
            lambda now: self._rest(now) if now.dark else None,
            lambda now: self._drink(now, URGENT, FAR),
            lambda now: self._eat(now, URGENT, FAR),
            self._prepare_night,
            self._rest,
            self._hunt,
            lambda now: self._drink(now, TOP_UP, NEAR, first=True),
            lambda now: self._eat(now, TOP_UP, NEAR, first=True),
            self._harvest,
            self._guard_plant,
            self._craft_nearby,
            self._gather_wood,
            self._craft_anywhere,
            self._sapling,
            lambda now: self._mine(now, "stone"),
            self._place_stone,
            self._plant,
            lambda now: self._mine(now, "coal"),
            self._furnace,
            lambda now: self._mine(now, "iron"),
            lambda now: self._mine(now, "diamond"),
            self._wander,
        )

    async def decide(self, observation: Observation, history: Sequence[HistoryEntry]) -> PolicyDecision:
        plan = self.plan(observation)
        call = {"tool_name": TOOL_NAME, "arguments": {"actions": plan.actions}}
        return PolicyDecision(tool_calls=[call], meta={"goal": plan.goal})

    async def aclose(self) -> None:
        return None

    def plan(self, observation: Observation) -> Plan:
        """The actions for this observation (synchronous: the map, plus what we remember)."""
        now = Now(observation, self._remember_ground(observation.semantic), self._garden)
        health = now.count("health")
        self._recovering = health < RECOVERED_HEALTH and (self._recovering or health <= LOW_HEALTH)
        self._tend(now)
        plan = next((found for rule in self._rules if (found := rule(now)) and found.actions), Plan("wait", []))
        actions = safe_prefix(plan.actions[: self.max_actions], now.position, now.mask("lava")) or ["noop"]
        self._last = (now.position, now.facing, plan.goal, len(actions))
        self._asleep = self._asleep or "sleep" in actions
        self._last_health = health
        return Plan(plan.goal, actions)

    def _remember_ground(self, semantic: np.ndarray) -> np.ndarray:
        """The map with flying arrows replaced by what was under them before: an arrow over water must
        not look like an opening in a shelter's wall."""
        arrows = semantic == SEMANTIC_IDS["arrow"]
        if self._ground is not None and self._ground.shape == semantic.shape and arrows.any():
            semantic = np.where(arrows, self._ground, semantic)
        self._ground = semantic
        return semantic

    # --- survival -------------------------------------------------------------------------------

    def _keep_sleeping(self, now: Now) -> Plan | None:
        """Crafter keeps a sleeper asleep until energy is full; only damage wakes it early."""
        if now.count("energy") >= MAX_VITAL or now.count("health") < self._last_health:
            self._asleep = False
        return Plan("sleep", ["noop"] * self.max_actions) if self._asleep else None

    def _fight(self, now: Now) -> Plan | None:
        direction = now.adjacent(HOSTILES)
        if direction is None:
            return None
        return Plan("fight", [MOVES[direction]] + ["do"] * now.hits(ZOMBIE_HEALTH))

    def _shoot_back(self, now: Now) -> Plan | None:
        """In a skeleton's line of fire: attack it when it is close and we are fit (routes and goals
        keep out of its lines where they can)."""
        if not now.fire[now.position] or now.count("health") < HUNT_HEALTH:
            return None
        route = now.grid.face(now.mask("skeleton"), ["do"] * now.hits(SKELETON_HEALTH), NEAR // 2, risky=True)
        return Plan("defeat_skeleton", route) if route else None

    def _hunt(self, now: Now) -> Plan | None:
        if "defeat_zombie" in now.achieved or now.count("health") < HUNT_HEALTH:
            return None
        route = now.grid.face(now.mask("zombie"), ["do"] * now.hits(ZOMBIE_HEALTH), NEAR)
        return Plan("defeat_zombie", route) if route else None

    def _drink(self, now: Now, threshold: int, reach: int, first: bool = False) -> Plan | None:
        """Drink up when at or below `threshold` (or, with `first`, to unlock collect_drink)."""
        drink = now.count("drink")
        if drink > threshold and not (first and "collect_drink" not in now.achieved):
            return None
        route = now.grid.face(now.mask("water"), ["do"] * (MAX_VITAL - drink + 1), reach)
        return Plan("collect_drink", route) if route else None

    def _eat(self, now: Now, threshold: int, reach: int, first: bool = False) -> Plan | None:
        if now.count("food") > threshold and not (first and "eat_cow" not in now.achieved):
            return None
        route = now.grid.face(now.mask("cow"), ["do"] * now.hits(COW_HEALTH), reach)
        return Plan("eat_cow", route) if route else None

    def _prepare_night(self, now: Now) -> Plan | None:
        """Before dusk, fill up (a night in a shelter is ~165 steps of hunger and thirst), but only
        where there and back still leaves time to walk to the shelter before dusk."""
        if not DUSK - PREPARE <= now.phase < DUSK or now.enclosed():
            return None
        walk = self._walk_home(now)
        reach = (DUSK + PREPARE_GRACE - now.phase - (walk or 0)) // 2
        if reach <= 0:
            return None
        return self._eat(now, FULL_FOOD, reach) or self._drink(now, FULL_DRINK, reach)

    # --- shelter --------------------------------------------------------------------------------

    def _stay_in(self, now: Now) -> Plan | None:
        """Walled in at night (or while healing, fed, before the evening): stay.

        Hunger or thirst at zero costs a health point per 16 steps, which beats walking out among
        the night's zombies; only a nearly dead player leaves for food or water.
        """
        if not now.enclosed():
            return None
        starving = not (now.count("food") and now.count("drink"))
        if starving and now.count("health") <= DESPERATE_HEALTH:
            return None
        if now.dark or (self._recovering and now.fed and now.phase < DUSK - PREPARE):
            return self._sheltered(now)
        return None

    def _sheltered(self, now: Now) -> Plan:
        """Inside: drink from a water wall, sleep while energy is below full, else wait."""
        water = now.adjacent(("water",))
        if water is not None and now.count("drink") < MAX_VITAL:
            return Plan("collect_drink", [MOVES[water]] + ["do"] * (MAX_VITAL - now.count("drink")))
        if now.count("energy") < MAX_VITAL:
            return Plan("sleep", ["sleep"] + ["noop"] * (self.max_actions - 1))
        return Plan("wait", ["noop"] * self.max_actions)

    def _rest(self, now: Now) -> Plan | None:
        """At night, before dusk, when tired, or when hurt (and fed): get walled in, then stay."""
        tired = now.count("energy") <= REST_ENERGY
        if not (now.dark or (self._recovering and now.fed) or tired or self._dusk_soon(now)):
            self._shelter = None
            return None
        if now.enclosed():
            return self._sheltered(now)
        if self._last is not None and self._last[:3] == (now.position, now.facing, "shelter") and self._shelter:
            self._bad_entries.add(self._shelter.entry)  # a plug keeps failing (a creature, an arrow)
            self._shelter = None
        for _ in range(2):  # the remembered shelter, else (if it cannot be finished from here) a new one
            if self._shelter is None or not self._shelter_valid(now, self._shelter):
                self._shelter = self._find_shelter(now)
            actions = self._shelter.actions(now.grid, now.semantic, now.dig, FAR) if self._shelter else []
            if actions or self._shelter is None:
                break
            self._bad_entries.add(self._shelter.entry)
            self._shelter = None
        return Plan("shelter", actions)

    def _dusk_soon(self, now: Now) -> bool:
        """In the evening, leave early enough to reach tonight's shelter by dusk."""
        walk = self._walk_home(now) if DUSK - EVENING <= now.phase < DUSK else None
        return walk is not None and now.phase + walk + EVENING_SLACK >= DUSK

    def _walk_home(self, now: Now) -> int | None:
        """Actions to tonight's shelter (chosen now if need be), or None without one."""
        if self._shelter is None or not self._shelter_valid(now, self._shelter):
            self._shelter = self._find_shelter(now)
        if self._shelter is None:
            return None
        return len(self._shelter.actions(now.grid, now.semantic, now.dig, FAR))

    def _find_shelter(self, now: Now) -> Shelter | None:
        """Near our plant if we have one (it grows only while we are near); water in a wall is a plus."""
        near = self._garden.plant if self._garden is not None else None
        return find_shelter(
            now.grid,
            now.semantic,
            now.dig,
            now.sites,
            reach=FAR,
            avoid=self._bad_entries,
            wet_detour=WET_DETOUR,
            near=near,
            radius=PLANT_RANGE - 2,
        )

    def _shelter_valid(self, now: Now, shelter: Shelter) -> bool:
        if now.position in (shelter.tile(1), shelter.tile(2)):
            return True  # inside, the entry is behind us
        return bool(now.sites[0][shelter.direction][shelter.entry])

    # --- the garden -----------------------------------------------------------------------------

    def _tend(self, now: Now) -> None:
        """Count our plant's growth: one step per step while we are within PLANT_RANGE (Env.step)."""
        garden = self._garden
        if garden is not None and not now.shows(garden.plant, ("plant",)):
            self._garden = garden = None
        if garden is not None and self._last is not None:
            distance = abs(garden.plant[0] - now.position[0]) + abs(garden.plant[1] - now.position[1])
            garden.age += self._last[3] if distance < PLANT_RANGE else 0
            if now.eaten_plants > self._eaten_plants:
                garden.age = 0
        self._eaten_plants = now.eaten_plants

    def _harvest(self, now: Now) -> Plan | None:
        """Eat the plant once ripe; hitting it earlier does nothing (Player._do_object)."""
        garden = self._garden
        if garden is None or garden.age < RIPE_AGE or ("eat_plant" in now.achieved and now.count("food") > TOP_UP):
            return None
        route = now.grid.face(single(now.semantic.shape, garden.plant), ["do"], FAR)
        if route and len(route) <= STRIKE:  # next to it already: if it is not ripe yet, come back later
            garden.age -= RIPE_RETRY
        return Plan("eat_plant", route) if route else None

    def _guard_plant(self, now: Now) -> Plan | None:
        """Plug the open side of our plant (just planted, or just eaten from) with stone."""
        if self._garden is None or not now.count("stone"):
            return None
        gaps = np.zeros(now.semantic.shape, dtype=bool)
        for tile in self._garden.walls():
            gaps[tile] = now.shows(tile, GROUND)
        route = now.grid.face_open(gaps, ["place_stone"], REACH) if gaps.any() else None
        return Plan("guard_plant", route) if route else None

    def _plant(self, now: Now) -> Plan | None:
        """Plant a sapling in a nook walled on three sides (`navigation.nooks`)."""
        if now.dark or self._garden is not None or not (now.count("stone") and now.count("wood_pickaxe")):
            return None
        if not now.count("sapling"):
            return None
        found = plant_route(now.grid, now.semantic, REACH)
        if found is None:
            return None
        route, door, direction = found
        if safe_prefix(route[: self.max_actions], now.position, now.mask("lava"))[-1:] == ["place_plant"]:
            dx, dy = DIRECTIONS[direction]
            self._garden = Garden(plant=(door[0] + dx, door[1] + dy), door=door)
        return Plan("place_plant", route)

    # --- the tech tree --------------------------------------------------------------------------

    def _craft_nearby(self, now: Now) -> Plan | None:
        for stations in (("table",), ("table", "furnace")):
            makes = [f"make_{tool}" for tool in _craftable(now, stations)]
            route = now.grid.stand(_stand_for(now, stations), makes, REACH) if makes else None
            if route:
                return Plan(makes[0], route)
        return None

    def _gather_wood(self, now: Now) -> Plan | None:
        """Wood for a table and the wood tools first (a pickaxe early means a shelter by dusk), then more."""
        if not now.count("wood_pickaxe"):
            target = TABLE_WOOD + sum(_MAKE[tool]["uses"]["wood"] for tool in ("wood_pickaxe", "wood_sword"))
        else:
            target = min(MAX_VITAL, _missing(now, "wood") + TABLE_WOOD)
        if now.count("wood") >= target:
            return None
        route = now.grid.face(now.targets("tree"), ["do"], REACH)
        return Plan("collect_wood", route) if route else None

    def _craft_anywhere(self, now: Now) -> Plan | None:
        """No table within reach: place one here (it costs wood) if some tool is then affordable."""
        inventory = dict(now.inventory)
        inventory["wood"] = inventory.get("wood", 0) - TABLE_WOOD
        if inventory["wood"] < 0:
            return None
        tools = [tool for tool in TOOLS if not now.count(tool) and _MAKE[tool]["nearby"] == ["table"]]
        if not any(_affordable(_MAKE[tool]["uses"], inventory) for tool in tools):
            return None
        route = now.grid.face_open(now.mask(*STATION_GROUND), ["place_table"], NEAR)
        return Plan("place_table", route) if route else None

    def _sapling(self, now: Now) -> Plan | None:
        if now.count("sapling") and "place_plant" not in now.achieved:
            route = now.grid.face_open(now.mask("grass"), ["place_plant"], NEAR)
            return Plan("place_plant", route) if route else None
        if "collect_sapling" in now.achieved:
            return None
        route = now.grid.face_open(now.mask("grass"), ["do"] * SAPLING_TRIES, NEAR)
        return Plan("collect_sapling", route) if route else None

    def _mine(self, now: Now, material: str) -> Plan | None:
        """Mine `material` up to what the remaining tools (and for stone a furnace and plugs) need."""
        unlocked = f"collect_{material}" in now.achieved
        if material == "stone":
            furnace = 0 if "place_furnace" in now.achieved else FURNACE_STONE
            target = min(MAX_VITAL, _missing(now, "stone") + furnace + PLUG_STONES)
        elif material == "diamond":
            target = MAX_VITAL
        else:
            target = _missing(now, material) or int(not unlocked)
        if now.count(material) >= target or material not in now.dig:
            return None
        route = now.grid.face(now.targets(material), ["do"], FAR)
        return Plan(f"collect_{material}", route) if route else None

    def _place_stone(self, now: Now) -> Plan | None:
        if "place_stone" in now.achieved or not now.count("stone"):
            return None
        route = now.grid.face_open(now.mask(*STONE_GROUND), ["place_stone"], NEAR)
        return Plan("place_stone", route) if route else None

    def _furnace(self, now: Now) -> Plan | None:
        """A furnace next to a table (iron tools need both within the 3x3 around the player): for the
        achievement, or when we hold what iron tools need and no table with a furnace is within reach
        (`_craft_nearby` would have gone there)."""
        iron_tools = _craftable(now, ("table", "furnace"))
        if ("place_furnace" in now.achieved and not iron_tools) or now.count("stone") < FURNACE_STONE:
            return None
        ground = now.mask(*STATION_GROUND)
        route = now.grid.face_open(ground, ["place_furnace"], REACH, stand=_stand_for(now, ("table",)))
        if route:
            return Plan("place_furnace", route)
        spare = now.count("wood") - sum(_MAKE[tool]["uses"].get("wood", 0) for tool in iron_tools)
        route = now.grid.face_open(ground, ["place_table"], NEAR) if spare >= TABLE_WOOD else None
        return Plan("place_table", route) if route else None

    def _wander(self, now: Now) -> Plan | None:
        return Plan("wander", [MOVES[self._random.randrange(len(MOVES))]] * 4)
