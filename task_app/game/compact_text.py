"""The compact observation text: the facts of the full text (observation.py) in fewer tokens, for
trainers whose context counts every tool result (docs/trainers/, "Compact observations").

    Step 12/10000, day
    HP 9 Food 8 Drink 7 Energy 9 | wood 2, sapling 1
    Done 2/22: collect_wood, place_table
    At 31,28 facing left: tree
    T T . . ~        (the 9x7 map around you, @ = you; top row is up)
    ...
    Key: @ you, T tree, . grass, ~ water
    Near: tree 2L1U, water 3R, stone 4L2D; none: coal, iron, ...

Built from an `Observation` (its structured data and map, and the first line of its full text, which
already says the step, day or night and sleep), so any observation can be shown either way.
"""

from __future__ import annotations

from typing import Literal

from .actions import ACHIEVEMENTS
from .observation import (
    _DIRECTION_NAMES,
    _VIEW_SYMBOLS,
    NEARBY_KINDS,
    SEMANTIC_NAMES,
    VITALS,
    Observation,
    local_view,
    nearest,
)

TextFormat = Literal["full", "compact"]
TEXT_FORMATS: tuple[TextFormat, ...] = ("full", "compact")


def _offset(dx: int, dy: int) -> str:
    """`2L1U` for 2 left and 1 up; `0` for here."""
    parts = []
    if dx:
        parts.append(f"{abs(dx)}{'R' if dx > 0 else 'L'}")
    if dy:
        parts.append(f"{abs(dy)}{'D' if dy > 0 else 'U'}")
    return "".join(parts) or "0"


def compact_text(observation: Observation) -> str:
    data, semantic = observation.data, observation.semantic
    inventory: dict[str, int] = data["inventory"]
    x, y = data["player_position"]
    dx, dy = data["player_direction"]
    tx, ty = x + dx, y + dy
    inside = 0 <= tx < semantic.shape[0] and 0 <= ty < semantic.shape[1]
    facing = SEMANTIC_NAMES[semantic[tx, ty]] if inside else "edge"
    vitals = " ".join(f"{name.capitalize()} {inventory[name]}" for name in VITALS)
    vitals = vitals.replace("Health", "HP", 1)
    items = ", ".join(f"{name} {count}" for name, count in inventory.items() if name not in VITALS and count > 0)
    unlocked = [name for name in ACHIEVEMENTS if data["achievements_status"].get(name)]
    view = local_view(semantic, (x, y))
    seen = dict.fromkeys(name for row in view for name in row)
    key = ", ".join(
        f"{_VIEW_SYMBOLS[name]} {'you' if name == 'player' else name}"
        for name in sorted(seen, key=lambda n: n != "player")
    )
    found = nearest(semantic, (x, y), NEARBY_KINDS)
    near = ", ".join(f"{kind} {_offset(*found[kind])}" for kind in NEARBY_KINDS if kind in found)
    missing = [kind for kind in NEARBY_KINDS if kind not in found]
    lines = [
        observation.text.split("\n", 1)[0],
        f"{vitals} | {items or 'no items'}",
        f"Done {len(unlocked)}/{len(ACHIEVEMENTS)}: {', '.join(unlocked) or 'none'}",
        f"At {x},{y} facing {_DIRECTION_NAMES.get((dx, dy), 'down')}: {facing}",
    ]
    if data.get("terminated"):
        lines.append("You died. The episode is over.")
    elif data.get("truncated"):
        lines.append("The episode has reached its length limit.")
    lines += [" ".join(_VIEW_SYMBOLS[name] for name in row) for row in view]
    lines.append(f"Key: {key}")
    lines.append(f"Near: {near or 'nothing'}" + (f"; none: {', '.join(missing)}" if missing else ""))
    return "\n".join(lines)


def observation_text(observation: Observation, text_format: TextFormat = "full") -> str:
    """The text a model reads, in `text_format`."""
    return compact_text(observation) if text_format == "compact" else observation.text
