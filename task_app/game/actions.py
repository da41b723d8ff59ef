"""Crafter's actions by name and id, and the normalisation of model tool calls (docs/contract.md, "The tool").

A model may answer in any of the shapes trainers have seen work: OpenAI `tool_calls` entries
(`{"function": {"name", "arguments"}}`), the old system's simplified `{"tool_name"|"tool"|"name", "arguments"|"args"}`,
a legacy `function_call`, the `interact` tool with `action` or `actions`, action ids as ints, or a
tool named after an action. Everything we cannot execute is dropped and reported, never guessed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import crafter.constants

from ..core import json_codec

ACTIONS: tuple[str, ...] = tuple(crafter.constants.actions)
ACTION_IDS: dict[str, int] = {name: index for index, name in enumerate(ACTIONS)}
ACHIEVEMENTS: tuple[str, ...] = tuple(sorted(crafter.constants.achievements))
TOOL_NAME = "interact_many"
NOOP = "noop"
_MULTI_TOOLS = {TOOL_NAME, "interact"}


@dataclass(frozen=True)
class Rejection:
    """One item of a model's answer that could not become an action."""

    item: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"item": self.item, "reason": self.reason}


@dataclass(frozen=True)
class ActionPlan:
    """The actions one decision will execute, plus what was dropped and why."""

    actions: tuple[str, ...]
    rejected: tuple[Rejection, ...] = field(default_factory=tuple)
    fallback_noop: bool = False

    @property
    def ids(self) -> list[int]:
        return [ACTION_IDS[name] for name in self.actions]

    def tool_call(self) -> dict[str, Any]:
        """The normalised call as trajectories record it."""
        return {"tool_name": TOOL_NAME, "arguments": {"actions": list(self.actions)}}


def action_name(item: object) -> str | None:
    """The action an item names: an exact (case-insensitive) name or an id in range."""
    if isinstance(item, bool):
        return None
    if isinstance(item, int):
        return ACTIONS[item] if 0 <= item < len(ACTIONS) else None
    if isinstance(item, str):
        key = item.strip().lower().replace("-", "_").replace(" ", "_")
        return key if key in ACTION_IDS else None
    return None


def _short(item: object, limit: int = 80) -> str:
    text = item if isinstance(item, str) else json_codec.dumps(item, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _call_parts(call: object) -> tuple[str | None, object]:
    """(tool name, raw arguments) of any accepted tool-call shape."""
    if not isinstance(call, Mapping):
        return None, None
    function = call.get("function", call.get("function_call"))
    if isinstance(function, Mapping):
        return function.get("name"), function.get("arguments")
    name = call.get("tool_name") or call.get("tool") or call.get("name")
    arguments = call.get("arguments", call.get("args"))
    return name, arguments


def _parse_arguments(raw: object) -> tuple[Mapping[str, Any] | None, str | None]:
    if raw is None:
        return {}, None
    if isinstance(raw, Mapping):
        return raw, None
    if isinstance(raw, str):
        if not raw.strip():
            return {}, None
        try:
            parsed = json_codec.loads(raw)
        except json_codec.JSONDecodeError:
            return None, "arguments are not valid JSON"
        if isinstance(parsed, Mapping):
            return parsed, None
        if isinstance(parsed, list):
            return {"actions": parsed}, None
        return None, "arguments are not a JSON object"
    return None, "arguments are not an object"


def _items_of(name: str, arguments: Mapping[str, Any]) -> tuple[list[object], str | None]:
    actions = arguments.get("actions")
    if isinstance(actions, list):
        return actions, None
    if isinstance(actions, str | int):
        return [actions], None
    if "action" in arguments:
        return [arguments["action"]], None
    if name in _MULTI_TOOLS:
        return [], "no actions in the arguments"
    return [name], None


def normalise_tool_calls(tool_calls: Iterable[object] | None, max_actions: int) -> ActionPlan:
    """Turn a model's tool calls into at most `max_actions` executable actions."""
    accepted: list[str] = []
    rejected: list[Rejection] = []
    for call in tool_calls or ():
        name, raw_arguments = _call_parts(call)
        if not isinstance(name, str) or not name:
            rejected.append(Rejection(_short(call), "tool call has no name"))
            continue
        arguments, problem = _parse_arguments(raw_arguments)
        if arguments is None:
            rejected.append(Rejection(_short(raw_arguments), problem or "bad arguments"))
            continue
        if name not in _MULTI_TOOLS and action_name(name) is None:
            rejected.append(Rejection(name, "unknown tool"))
            continue
        items, problem = _items_of(name, arguments)
        if problem:
            rejected.append(Rejection(name, problem))
        for item in items:
            action = action_name(item)
            if action is None:
                rejected.append(Rejection(_short(item), "unknown action"))
            elif len(accepted) >= max_actions:
                rejected.append(Rejection(action, f"more than {max_actions} actions in one decision"))
            else:
                accepted.append(action)
    if not accepted:
        return ActionPlan((NOOP,), tuple(rejected), fallback_noop=True)
    return ActionPlan(tuple(accepted), tuple(rejected))


def plan_from_names(names: Sequence[str], max_actions: int) -> ActionPlan:
    """Shortcut for built-in policies that already speak action names."""
    return normalise_tool_calls([{"tool_name": TOOL_NAME, "arguments": {"actions": list(names)}}], max_actions)
