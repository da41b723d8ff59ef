"""What the trainer adapters share: the action names, the instructions a text-only model gets, reading
actions out of a model's reply, the line that reports a step, and an episode's running tally.

The server is the judge of actions (unknown names come back in `info.rejected`, a step with nothing
runnable runs `noop`); the parsing here only finds the list a reply meant.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ._results import StepResult

# crafter's action names, in crafter's order (the server's `GET /task_info?seed=N` lists them too).
ACTIONS: tuple[str, ...] = (
    "noop",
    "move_left",
    "move_right",
    "move_up",
    "move_down",
    "do",
    "sleep",
    "place_stone",
    "place_table",
    "place_furnace",
    "place_plant",
    "make_wood_pickaxe",
    "make_stone_pickaxe",
    "make_iron_pickaxe",
    "make_wood_sword",
    "make_stone_sword",
    "make_iron_sword",
)
MAX_ACTIONS = 8  # the server's default TASKAPP_MAX_ACTIONS_PER_DECISION; more are rejected, not run
EPISODE_OVER = "The episode is over."

TEXT_INSTRUCTIONS = (
    "You play Crafter, a 2D survival game: collect resources, craft tools, eat, drink and sleep, and unlock "
    "as many achievements as you can. Each turn you see the world around you. Answer with 1 to "
    f"{MAX_ACTIONS} actions to run in order, as one bracketed list at the end of your reply, for example "
    "[move_left, move_left, do]. 'do' interacts with the tile you face (collect, attack, drink, eat). "
    f"Actions: {', '.join(ACTIONS)}."
)

_TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)
_BRACKETS = re.compile(r"\[([^\[\]]*)\]")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_ -]*")


def _names(value: Any) -> list[str] | None:
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return [item.strip() for item in value if item.strip()]
    if isinstance(value, str):
        return [value.strip()] if value.strip() else []
    return None


def _from_json(text: str) -> list[str] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if isinstance(value, dict):
        arguments = value.get("arguments", value)
        if isinstance(arguments, str):
            return _from_json(arguments)
        if isinstance(arguments, dict):
            return _names(arguments.get("actions", arguments.get("action")))
    return _names(value)


def parse_actions(reply: str) -> list[str]:
    """The actions a model's text reply names: a `<tool_call>` of `interact_many` (the Hermes/Qwen
    format), a JSON object `{"actions": [...]}`, or the last bracketed list (`[move_left, do]`).
    Nothing found: an empty list (the server then runs `noop` and says so in `info.noop_fallback`)."""
    for match in _TOOL_CALL.finditer(reply):
        found = _from_json(match.group(1))
        if found is not None:
            return found
    stripped = reply.strip()
    if stripped.startswith("{"):
        found = _from_json(stripped)
        if found is not None:
            return found
    for inside in reversed(_BRACKETS.findall(reply)):
        names = [part.strip().strip("'\"`").strip() for part in inside.split(",")]
        names = [name for name in names if name]
        if names and all(_NAME.fullmatch(name) for name in names):
            return names
    return []


def step_report(step: StepResult) -> str:
    """One line on what a step did: the actions run, what was refused, the reward and unlocks."""
    parts = [f"Ran {', '.join(step.info.actions) or 'nothing'}"]
    if step.info.rejected:
        parts.append("refused " + "; ".join(f"{each.item} ({each.reason})" for each in step.info.rejected))
    if step.reward:
        parts.append(f"reward {step.reward:+g}")
    if step.info.achievements_added:
        parts.append("unlocked " + ", ".join(step.info.achievements_added))
    return ". ".join(parts) + "."


def step_text(step: StepResult) -> str:
    """What a model reads after a step: the report, the observation, and the end when it came."""
    lines = [step_report(step), step.observation.text]
    if step.done:
        lines.append(EPISODE_OVER)
    return "\n".join(lines)


@dataclass
class Tally:
    """An episode's running totals: crafter's return, the achievements unlocked, steps taken."""

    total: float = 0.0
    steps: int = 0
    achievements: list[str] = field(default_factory=list)
    done: bool = False

    def add(self, step: StepResult) -> None:
        self.total += step.reward or 0.0
        self.steps += 1
        self.achievements += [name for name in step.info.achievements_added if name not in self.achievements]
        self.done = step.done
