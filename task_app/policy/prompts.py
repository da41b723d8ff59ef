"""What `crafter-react` tells the model: the system prompt, the user turn, the `interact_many` tool.

The recipes are generated from `crafter.constants` (the installed game's data.yaml), so the prompt
states exactly the rules the game enforces: e.g. in crafter 1.8.3 a table costs 2 wood, a furnace
4 stone, a tree turns into grass once its wood is taken, and `make_*` needs its stations within one
tile (diagonals count), which is `world.nearby(pos, 1)` in crafter/objects.py.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import crafter.constants

from ..game import ACHIEVEMENTS, ACTIONS, TOOL_NAME
from .base import HistoryEntry

TOOL_DESCRIPTION = "Execute a short sequence of Crafter actions in order (1-{n})."
IMAGE_ONLY_INSTRUCTION = (
    "This image is your current view of the Crafter world (you are in the centre). "
    f"Choose your next actions and call {TOOL_NAME}."
)
_MAX_ITEM = 9  # crafter's inventory cap per item (data.yaml `items.*.max`)
_MOVES = {"move_left": "x-1, west", "move_right": "x+1, east", "move_up": "y-1, north", "move_down": "y+1, south"}
_ACTION_NOTES = {
    "noop": "do nothing",
    "do": "act on the tile you face: collect it, hit a creature, drink water, eat a ripe plant",
    "sleep": "sleep to restore energy (you stay asleep until energy is full)",
}


def _items(amounts: Mapping[str, int]) -> str:
    return " + ".join(f"{count} {name}" for name, count in amounts.items()) or "nothing"


def recipe_lines() -> list[str]:
    """The game's collect / place / make rules as text, straight from crafter's data."""
    lines = ["Collect (face the tile, then `do`):"]
    for material, info in crafter.constants.collect.items():
        needs = _items(info["require"]) if info["require"] else "no tool"
        gain = _items(info["receive"])
        chance = f" with {int(info['probability'] * 100)}% chance" if "probability" in info else ""
        after = "" if info["leaves"] == material else f"; the tile becomes {info['leaves']}"
        lines.append(f"- {material}: gives {gain}{chance}, needs {needs}{after}")
    lines.append("Place (onto the tile you face; it must be one of the listed ground types):")
    for name, info in crafter.constants.place.items():
        lines.append(f"- place_{name}: costs {_items(info['uses'])}, onto {', '.join(info['where'])}")
    lines.append("Make (the listed stations must be within 1 tile of you, diagonals count):")
    for name, info in crafter.constants.make.items():
        lines.append(f"- make_{name}: costs {_items(info['uses'])}, near {' and '.join(info['nearby'])}")
    return lines


def _action_lines() -> list[str]:
    lines = []
    for name in ACTIONS:
        if name in _MOVES:
            note = f"step {_MOVES[name]}; only turns you if that tile is blocked"
        elif name in _ACTION_NOTES:
            note = _ACTION_NOTES[name]
        elif name.startswith(("place_", "make_")):
            note = "see the recipes"
        else:  # pragma: no cover - crafter has no other actions
            note = ""
        lines.append(f"- {name}: {note}")
    return lines


@functools.cache
def system_prompt(max_actions: int = 8) -> str:
    """The rules, recipes, strategy, how to read the observation, and the answer format."""
    place, make = crafter.constants.place, crafter.constants.make
    furnace_stone = place["furnace"]["uses"].get("stone", 1)
    # Enough for the table and every tool, capped by the inventory limit.
    wood = min(_MAX_ITEM, place["table"]["uses"].get("wood", 0) + sum(r["uses"].get("wood", 0) for r in make.values()))
    stone = min(
        _MAX_ITEM,
        furnace_stone + place["stone"]["uses"]["stone"] + sum(r["uses"].get("stone", 0) for r in make.values()),
    )
    vanishing = [name for name, info in crafter.constants.collect.items() if info["leaves"] != name]
    sections = [
        "You are an expert player of Crafter, a 2D open-world survival game (a small Minecraft). "
        "Each turn you read your surroundings as text and choose the next few actions.",
        "",
        f"GOAL: unlock as many of the {len(ACHIEVEMENTS)} achievements as possible while staying alive. "
        "Each counts once, the first time you do it: " + ", ".join(ACHIEVEMENTS) + ".",
        "",
        "RULES",
        "- The world is a grid. You stand on one tile and face one of four directions. `do` and `place_*` "
        "act on the tile you face.",
        "- A move turns you toward its direction and steps there if the tile is grass, sand or path. "
        "Trees, stone, ores, water, tables, furnaces and creatures block you: the move then only turns you "
        "to face them, which is how you aim `do` at them. Stepping onto lava kills you.",
        "- Health, food, drink and energy go from 0 to 9 and drop over time. Eat a cow (hit it with `do` "
        "until it dies) or a ripe plant for food; `do` facing water to drink; `sleep` to restore energy. "
        "If food, drink or energy is 0 you lose health; otherwise health slowly comes back. Health 0 = death.",
        "- Zombies roam grass (more at night) and hit hard, much harder while you sleep; skeletons shoot "
        "arrows in dark tunnel areas. Face them and `do` repeatedly to fight; swords add damage.",
        f"- Each inventory item holds at most {_MAX_ITEM}.",
        "",
        "RECIPES (the exact rules of this game)",
        *recipe_lines(),
        "",
        "STRATEGY",
        f"1. Collect about {wood} wood from trees, then place_table next to you and, while it is "
        "within one tile, make_wood_pickaxe and make_wood_sword.",
        f"2. Mine about {stone} stone with the wood pickaxe: place_stone once, then at a table "
        "make_stone_pickaxe and make_stone_sword (bring wood too).",
        f"3. Mine coal; place_furnace ({furnace_stone} stone) right next to a table; mine iron with the stone "
        "pickaxe; make_iron_pickaxe and make_iron_sword standing next to both; then mine diamond.",
        "4. On the way: drink when drink is low (collect_drink), eat a cow (eat_cow), collect a sapling from "
        "grass and place_plant it, eat the plant once ripe, sleep when energy is low (ideally walled in by "
        "stone) to earn wake_up, and defeat a zombie and a skeleton when armed.",
        "5. Keep food, drink and energy above 3. Never walk into lava. If nothing useful is in view, explore "
        "in one direction with several moves instead of wandering back and forth.",
        "",
        "READING THE OBSERVATION",
        "- 'Map around you' is 9 columns by 7 rows: the top row is north (up, y-1), the left column is west "
        "(left, x-1). You are @ in the middle; the Legend names each symbol.",
        "- 'the tile in front of you' is what `do` or `place_*` would act on right now.",
        "- 'Nearest' gives the offset to the closest tile of each kind. 'tree: 3 right' means: move_right "
        "three times; the last move only turns you to face the tree (it blocks), then `do`. For '2 left, "
        "1 up' use move_left twice and move_up once. Obstacles on the way can block a move.",
        f"- {', '.join(vanishing)} tiles turn into something else once collected (see RECIPES): each gives "
        "one unit, then go to the next one.",
        "",
        "ACTIONS",
        *_action_lines(),
        "",
        "ANSWER",
        f"Always call the {TOOL_NAME} tool with 1 to {max_actions} actions; they run in order. Plan 2-6 actions "
        "that make progress (walk to a target, face it, `do`). If you cannot call tools, answer with only a "
        'JSON object such as {"actions": ["move_right", "do"]}.',
    ]
    return "\n".join(sections)


def tool_schema(max_actions: int = 8) -> dict[str, Any]:
    """The one OpenAI function tool, `interact_many` (docs/contract.md, "The tool")."""
    return {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": TOOL_DESCRIPTION.format(n=max_actions),
            "parameters": {
                "type": "object",
                "properties": {
                    "actions": {
                        "type": "array",
                        "description": "Actions to execute in order.",
                        "items": {"type": "string", "enum": list(ACTIONS)},
                        "minItems": 1,
                        "maxItems": max_actions,
                    }
                },
                "required": ["actions"],
                "additionalProperties": False,
            },
        },
    }


def tool_choice() -> dict[str, Any]:
    """Force the model to call `interact_many`."""
    return {"type": "function", "function": {"name": TOOL_NAME}}


def _ran(entry: HistoryEntry) -> str:
    """One decision: what ran and what it unlocked."""
    actions = ", ".join(entry.actions) or "nothing ran"
    result = f"unlocked {', '.join(entry.achievements_added)}" if entry.achievements_added else "nothing new"
    return f"{actions} -> {result}"


def history_text(history: Sequence[HistoryEntry]) -> str:
    """The last decisions, oldest first: what ran and what it unlocked."""
    if not history:
        return "Your recent decisions: none yet."
    lines = ["Your recent decisions (oldest first):"]
    for entry in history:
        dropped = f" ({entry.rejected} invalid action(s) ignored)" if entry.rejected else ""
        lines.append(f"- #{entry.decision_index + 1}: {_ran(entry)}{dropped}")
    return "\n".join(lines)


def result_text(entries: Sequence[HistoryEntry]) -> str:
    """What ran since the model's last answer (`history: "messages"`: the tool result's first lines)."""
    if not entries:
        return "Nothing ran since your last answer."
    dropped = "; {n} invalid action(s) ignored"
    return "\n".join(
        f"Executed: {_ran(entry)}" + (dropped.format(n=entry.rejected) if entry.rejected else "") for entry in entries
    )


def turn_text(observation_text: str, max_actions: int = 8, result: str | None = None) -> str:
    """One turn of a multi-turn conversation: what ran (after the first turn), then the observation."""
    head = f"{result}\n\n" if result else ""
    return f"{head}{observation_text}\n\nChoose your next 1-{max_actions} actions and call {TOOL_NAME}."


def user_text(observation_text: str, history: Sequence[HistoryEntry], max_actions: int = 8) -> str:
    return (
        f"{observation_text}\n\n{history_text(history)}\n\n"
        f"Choose your next 1-{max_actions} actions and call {TOOL_NAME}."
    )


def build_messages(
    observation_text: str,
    history: Sequence[HistoryEntry],
    *,
    image_data_url: str | None = None,
    use_vision: bool = False,
    image_only: bool = False,
    max_actions: int = 8,
) -> list[dict[str, Any]]:
    """[system, user]: no multi-turn chat; the history is summarised in the user turn.

    `image_only` sends the frame and a one-line instruction instead of the text observation;
    `use_vision` adds the frame after the text. Without a frame both fall back to text.
    """
    system = {"role": "system", "content": system_prompt(max_actions)}
    image = {"type": "image_url", "image_url": {"url": image_data_url}} if image_data_url else None
    if image_only and image is not None:
        content: Any = [{"type": "text", "text": IMAGE_ONLY_INSTRUCTION}, image]
    elif use_vision and image is not None:
        content = [{"type": "text", "text": user_text(observation_text, history, max_actions)}, image]
    else:
        content = user_text(observation_text, history, max_actions)
    return [system, {"role": "user", "content": content}]
