"""Observations: the structured dict of docs/contract.md ("The environment") and the text the model reads.

Orientation everywhere: x grows to the right (`move_right`), y grows downwards (`move_down`); the
text map prints rows top to bottom (y - 3 .. y + 3) and columns left to right (x - 4 .. x + 4), the
same 9x7 window crafter draws on screen. (The old system printed this transposed.)
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from typing import Any

import crafter.constants
import numpy as np
from PIL import Image

from .actions import ACHIEVEMENTS
from .jit import compiled
from .worlds import GameEnv

MATERIALS: tuple[str, ...] = tuple(crafter.constants.materials)
OBJECT_KINDS: tuple[str, ...] = ("player", "cow", "zombie", "skeleton", "arrow", "plant")
# Semantic ids as crafter's SemanticView assigns them: 0 = nothing, then materials, then objects.
SEMANTIC_NAMES: tuple[str, ...] = ("none", *MATERIALS, *OBJECT_KINDS)
SEMANTIC_IDS: dict[str, int] = {name: index for index, name in enumerate(SEMANTIC_NAMES)}

VIEW_WIDTH, VIEW_HEIGHT = 9, 7
PATCH_RADIUS = 3
NEARBY_KINDS: tuple[str, ...] = (
    "tree",
    "water",
    "stone",
    "coal",
    "iron",
    "diamond",
    "cow",
    "zombie",
    "skeleton",
    "table",
    "furnace",
    "plant",
    "lava",
)
SYMBOLS: dict[str, str] = {
    "none": "?",
    "water": "~",
    "grass": ".",
    "stone": "#",
    "path": "_",
    "sand": ":",
    "tree": "T",
    "lava": "!",
    "coal": "c",
    "iron": "i",
    "diamond": "d",
    "table": "t",
    "furnace": "f",
    "player": "@",
    "cow": "C",
    "zombie": "Z",
    "skeleton": "S",
    "arrow": "a",
    "plant": "p",
}
OUTSIDE = "X"
VITALS: tuple[str, ...] = ("health", "food", "drink", "energy")  # inventory counters of 0..9, not items
_DIRECTION_NAMES = {(-1, 0): "left", (1, 0): "right", (0, -1): "up", (0, 1): "down"}
_NIGHT = 0.5
_OUTSIDE_ID = len(SEMANTIC_NAMES)  # the id `_window` gives cells beyond the map in the local view
_VIEW_NAMES = (*SEMANTIC_NAMES, "outside")
_VIEW_SYMBOLS = {**SYMBOLS, "outside": OUTSIDE}


@dataclass(frozen=True, slots=True)
class Observation:
    """What a policy sees before a decision."""

    text: str
    data: dict[str, Any]
    semantic: np.ndarray  # the whole map as semantic ids, [x, y]; internal, never on the wire
    image_png: bytes | None = None

    @property
    def image_base64(self) -> str | None:
        return base64.b64encode(self.image_png).decode("ascii") if self.image_png else None

    @property
    def image_data_url(self) -> str | None:
        encoded = self.image_base64
        return f"data:image/png;base64,{encoded}" if encoded else None


def encode_png(frame: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(frame).save(buffer, format="PNG", optimize=False, compress_level=1)
    return buffer.getvalue()


def direction_text(dx: int, dy: int) -> str:
    """`2 left, 1 up` for an offset; `here` for none."""
    parts = []
    if dx:
        parts.append(f"{abs(dx)} {'right' if dx > 0 else 'left'}")
    if dy:
        parts.append(f"{abs(dy)} {'down' if dy > 0 else 'up'}")
    return ", ".join(parts) or "here"


def nearest(semantic: np.ndarray, pos: tuple[int, int], kinds: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """Offset (dx, dy) to the nearest cell of each kind present on the map (Manhattan distance; of
    equally near cells the first in x-major order); the player's own cell never counts."""
    ids = np.array([SEMANTIC_IDS[kind] for kind in kinds], dtype=np.int64)
    found = _nearest_cells(semantic, pos[0], pos[1], ids)
    return {
        kind: (int(dx), int(dy))
        for kind, (distance, dx, dy) in zip(kinds, found.tolist(), strict=True)
        if distance >= 0
    }


@compiled
def _nearest_cells(semantic: np.ndarray, px: int, py: int, ids: np.ndarray) -> np.ndarray:
    """One pass over the map: per id, (distance, dx, dy) of its nearest cell, or (-1, 0, 0)."""
    width, height = semantic.shape
    far = width + height  # beyond any Manhattan distance on the map
    best = np.full(256, far, dtype=np.int64)
    where = np.zeros((256, 2), dtype=np.int64)
    for x in range(width):
        for y in range(height):
            if x == px and y == py:
                continue
            kind = semantic[x, y]
            distance = abs(x - px) + abs(y - py)
            if distance < best[kind]:
                best[kind], where[kind, 0], where[kind, 1] = distance, x, y
    out = np.zeros((len(ids), 3), dtype=np.int64)
    for index in range(len(ids)):
        kind = ids[index]
        out[index, 0] = best[kind] if best[kind] < far else -1
        out[index, 1], out[index, 2] = where[kind, 0] - px, where[kind, 1] - py
    return out


def _window(semantic: np.ndarray, pos: tuple[int, int], half_width: int, half_height: int, fill: int) -> np.ndarray:
    """The ids around `pos` as rows (dy, top to bottom) of columns (dx, left to right); `fill` beyond the map."""
    out = np.full((2 * half_height + 1, 2 * half_width + 1), fill, dtype=np.int64)
    x0, y0 = pos[0] - half_width, pos[1] - half_height
    xs = slice(max(x0, 0), min(pos[0] + half_width + 1, semantic.shape[0]))
    ys = slice(max(y0, 0), min(pos[1] + half_height + 1, semantic.shape[1]))
    if xs.start < xs.stop and ys.start < ys.stop:
        out[ys.start - y0 : ys.stop - y0, xs.start - x0 : xs.stop - x0] = semantic[xs, ys].T
    return out


def local_view(semantic: np.ndarray, pos: tuple[int, int]) -> list[list[str]]:
    """The 9x7 window of names around the player, rows top to bottom; `outside` beyond the map."""
    ids = _window(semantic, pos, VIEW_WIDTH // 2, VIEW_HEIGHT // 2, _OUTSIDE_ID)
    return [[_VIEW_NAMES[index] for index in row] for row in ids.tolist()]


def semantic_patch(semantic: np.ndarray, pos: tuple[int, int], radius: int = PATCH_RADIUS) -> list[list[int]]:
    """Square patch of ids, row = dy, column = dx, 0 outside the map (the old system's `semantic_map_patch7`)."""
    patch: list[list[int]] = _window(semantic, pos, radius, radius, 0).tolist()
    return patch


def _render_map(view: list[list[str]]) -> tuple[list[str], list[str]]:
    lines = [" ".join(_VIEW_SYMBOLS[name] for name in row) for row in view]
    seen = dict.fromkeys(name for row in view for name in row)  # in reading order
    legend = [
        f"{_VIEW_SYMBOLS[name]} {'you' if name == 'player' else name}"
        for name in sorted(seen, key=lambda n: n != "player")
    ]
    return lines, legend


def render_text(env: GameEnv, semantic: np.ndarray, terminated: bool, truncated: bool) -> str:
    player = env.player
    pos = (int(player.pos[0]), int(player.pos[1]))
    facing = (int(player.facing[0]), int(player.facing[1]))
    inventory = player.inventory
    target = (pos[0] + facing[0], pos[1] + facing[1])
    inside = 0 <= target[0] < semantic.shape[0] and 0 <= target[1] < semantic.shape[1]
    facing_name = SEMANTIC_NAMES[semantic[target]] if inside else "the edge of the world"
    daylight = float(env.world.daylight)
    unlocked = [name for name in ACHIEVEMENTS if player.achievements.get(name, 0) > 0]
    items = [f"{name} {count}" for name, count in inventory.items() if name not in VITALS and count > 0]
    vitals = ", ".join(f"{name} {inventory[name]}/9" for name in VITALS)
    map_lines, legend = _render_map(local_view(semantic, pos))
    found = nearest(semantic, pos, NEARBY_KINDS)

    lines = [
        f"Step {env.step_count}/{env.length}, {'night' if daylight < _NIGHT else 'day'}"
        + (", you are asleep" if player.sleeping else ""),
        f"Vitals: {vitals}",
        f"Inventory: {', '.join(items) if items else 'empty'}",
        f"Achievements ({len(unlocked)}/{len(ACHIEVEMENTS)}): {', '.join(unlocked) if unlocked else 'none'}",
        f"Position: x={pos[0]}, y={pos[1]}; facing {_DIRECTION_NAMES.get(facing, str(facing))},"
        f" the tile in front of you is {facing_name}",
    ]
    if terminated:
        lines.append("You died. The episode is over.")
    elif truncated:
        lines.append("The episode has reached its length limit.")
    lines += [
        "",
        "Map around you (9 wide, 7 high; top row is up/north, left column is left/west; you are @):",
        *map_lines,
        "Legend: " + ", ".join(legend),
        "",
        "Nearest (steps along x and y):",
    ]
    for kind in NEARBY_KINDS:
        if kind in found:
            dx, dy = found[kind]
            steps = abs(dx) + abs(dy)
            lines.append(f"- {kind}: {direction_text(dx, dy)} ({steps} step{'' if steps == 1 else 's'})")
    missing = [kind for kind in NEARBY_KINDS if kind not in found]
    if missing:
        lines.append(f"- not on the map: {', '.join(missing)}")
    return "\n".join(lines)


def structured(env: GameEnv, semantic: np.ndarray, terminated: bool, truncated: bool) -> dict[str, Any]:
    player = env.player
    pos = (int(player.pos[0]), int(player.pos[1]))
    counts = {name: int(player.achievements.get(name, 0)) for name in ACHIEVEMENTS}
    return {
        "inventory": {name: int(value) for name, value in player.inventory.items()},
        "achievements_status": {name: count > 0 for name, count in counts.items()},
        "achievements_counts": counts,
        "player_position": list(pos),
        "player_direction": [int(player.facing[0]), int(player.facing[1])],
        "semantic_map_patch7": semantic_patch(semantic, pos),
        "num_steps_taken": env.step_count,
        "max_steps_episode": env.length,
        "terminated": terminated,
        "truncated": truncated,
    }


def observe(
    env: GameEnv, *, terminated: bool = False, truncated: bool = False, image_size: int | None = None
) -> Observation:
    """Build the observation of `env` now; render and encode a PNG frame only if `image_size` is set."""
    semantic = env.semantic()
    data = structured(env, semantic, terminated, truncated)
    image = None
    if image_size:
        image = encode_png(env.frame(image_size))
        data.update(
            observation_image_format="png",
            observation_image_width=image_size,
            observation_image_height=image_size,
        )
    return Observation(render_text(env, semantic, terminated, truncated), data, semantic, image)
