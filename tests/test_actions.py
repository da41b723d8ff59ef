"""Tool-call normalisation (docs/contract.md, "The tool"): every accepted shape, every rejection reported."""

from __future__ import annotations

import json
from typing import Any

import crafter
import pytest

from task_app.game import ACHIEVEMENTS, ACTION_IDS, ACTIONS, normalise_tool_calls
from task_app.game.actions import action_name, plan_from_names

MAX = 8


def _openai(name: str, arguments: Any) -> dict[str, Any]:
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}


def _reasons(plan: Any) -> list[tuple[str, str]]:
    return [(rejection.item, rejection.reason) for rejection in plan.rejected]


def test_action_ids_are_the_contracts() -> None:
    """docs/contract.md, "The environment": the 17 actions by name and id (models send ids), crafter's
    22 achievements."""
    assert ACTIONS == (
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
    assert all(ACTION_IDS[name] == index for index, name in enumerate(ACTIONS))
    assert set(ACHIEVEMENTS) == set(crafter.constants.achievements) and len(ACHIEVEMENTS) == 22


@pytest.mark.parametrize(
    ("calls", "expected"),
    [
        pytest.param(
            [_openai("interact_many", json.dumps({"actions": ["move_left", "do"]}))],
            ("move_left", "do"),
            id="openai-json-string",
        ),
        pytest.param(
            [_openai("interact_many", {"actions": ["move_up", "move_up", "do"]})],
            ("move_up", "move_up", "do"),
            id="openai-object",
        ),
        pytest.param(
            [{"name": "interact_many", "arguments": '{"actions": ["sleep"]}'}],
            ("sleep",),
            id="legacy-function-call-object",
        ),
        pytest.param(
            [{"function_call": {"name": "interact_many", "arguments": '{"actions": ["place_table"]}'}}],
            ("place_table",),
            id="legacy-function-call-wrapped",
        ),
        pytest.param([{"tool_name": "interact_many", "arguments": {"actions": ["do"]}}], ("do",), id="tool_name"),
        pytest.param([{"tool": "interact_many", "args": {"actions": ["noop", "do"]}}], ("noop", "do"), id="tool+args"),
        pytest.param([{"tool": "interact_many", "args": '{"actions": ["do"]}'}], ("do",), id="args-json-string"),
        pytest.param([{"tool": "interact", "args": {"action": "move_down"}}], ("move_down",), id="interact-action"),
        pytest.param(
            [{"tool": "interact", "arguments": {"actions": ["move_left", "move_right"]}}],
            ("move_left", "move_right"),
            id="interact-actions",
        ),
        pytest.param([{"tool": "interact", "args": {"action": 5}}], ("do",), id="interact-action-id"),
        pytest.param(
            [_openai("interact_many", {"actions": [0, 5, 16]})],
            ("noop", "do", "make_iron_sword"),
            id="ids-in-range",
        ),
        pytest.param([{"tool": "interact_many", "args": {"actions": "do"}}], ("do",), id="actions-as-a-string"),
        pytest.param([{"tool": "interact", "args": '["do", "noop"]'}], ("do", "noop"), id="arguments-json-list"),
        pytest.param([{"tool_name": "move_left", "arguments": {}}], ("move_left",), id="tool-named-after-action"),
        pytest.param([_openai("do", "")], ("do",), id="openai-tool-named-after-action"),
        pytest.param([{"tool": "place_stone"}], ("place_stone",), id="tool-named-after-action-no-args"),
        pytest.param(
            [_openai("interact_many", {"actions": ["MOVE_LEFT", "Do", "make wood pickaxe", "place-table"]})],
            ("move_left", "do", "make_wood_pickaxe", "place_table"),
            id="case-insensitive",
        ),
        pytest.param(
            [_openai("interact_many", {"actions": ["move_left"]}), {"tool": "interact", "args": {"action": "do"}}],
            ("move_left", "do"),
            id="several-calls-in-order",
        ),
    ],
)
def test_accepted_shapes(calls: list[Any], expected: tuple[str, ...]) -> None:
    plan = normalise_tool_calls(calls, MAX)
    assert plan.actions == expected
    assert plan.rejected == ()
    assert plan.fallback_noop is False
    assert plan.ids == [ACTION_IDS[name] for name in expected]


@pytest.mark.parametrize(
    ("calls", "actions", "rejected"),
    [
        pytest.param(
            [_openai("interact_many", {"actions": [17, -1, 3]})],
            ("move_up",),
            [("17", "unknown action"), ("-1", "unknown action")],
            id="ids-out-of-range",
        ),
        pytest.param(
            [_openai("interact_many", {"actions": [True, False, "do"]})],
            ("do",),
            [("true", "unknown action"), ("false", "unknown action")],
            id="bools-are-not-ids",
        ),
        pytest.param(
            [_openai("interact_many", {"actions": ["jump", "craft_wood_pickaxe", "left", "do", None, 2.0]})],
            ("do",),
            [
                ("jump", "unknown action"),
                ("craft_wood_pickaxe", "unknown action"),
                ("left", "unknown action"),
                ("null", "unknown action"),
                ("2.0", "unknown action"),
            ],
            id="unknown-action-names",
        ),
        pytest.param(
            [_openai("fly", {"actions": ["do"]}), _openai("interact_many", {"actions": ["sleep"]})],
            ("sleep",),
            [("fly", "unknown tool")],
            id="unknown-tool",
        ),
        pytest.param(
            [_openai("interact_many", '{"actions": ["do"'), _openai("interact_many", '{"actions": ["sleep"]}')],
            ("sleep",),
            [('{"actions": ["do"', "arguments are not valid JSON")],
            id="malformed-json",
        ),
        pytest.param(
            [_openai("interact_many", "5"), _openai("interact_many", 5), _openai("interact_many", ["do"])],
            ("noop",),
            [
                ("5", "arguments are not a JSON object"),
                ("5", "arguments are not an object"),
                ('["do"]', "arguments are not an object"),
            ],
            id="arguments-of-the-wrong-type",
        ),
        pytest.param(
            [{"tool": "interact_many", "args": {"moves": ["do"]}}],
            ("noop",),
            [("interact_many", "no actions in the arguments")],
            id="interact-many-without-actions",
        ),
        pytest.param(
            [{"arguments": {"actions": ["do"]}}, "do", 5, None],
            ("noop",),
            [
                ('{"arguments":{"actions":["do"]}}', "tool call has no name"),
                ("do", "tool call has no name"),
                ("5", "tool call has no name"),
                ("null", "tool call has no name"),
            ],
            id="calls-without-a-name",
        ),
    ],
)
def test_rejections_are_reported(calls: list[Any], actions: tuple[str, ...], rejected: list[tuple[str, str]]) -> None:
    plan = normalise_tool_calls(calls, MAX)
    assert plan.actions == actions
    assert _reasons(plan) == rejected
    # none of these cases asks for a noop itself, so a lone noop is the fallback
    assert plan.fallback_noop is (actions == ("noop",))


def test_more_than_eight_actions_keeps_the_first_eight_and_reports_the_rest() -> None:
    asked = ["move_left", "move_right", "move_up", "move_down", "do", "noop", "sleep", "do", "place_stone", "do"]
    plan = normalise_tool_calls([_openai("interact_many", {"actions": asked})], MAX)
    assert plan.actions == tuple(asked[:8])
    assert _reasons(plan) == [
        ("place_stone", "more than 8 actions in one decision"),
        ("do", "more than 8 actions in one decision"),
    ]
    assert plan.fallback_noop is False


def test_the_cap_counts_across_calls_and_follows_max_actions() -> None:
    calls = [_openai("interact_many", {"actions": ["do"] * 3}), {"tool": "interact", "args": {"action": "sleep"}}]
    plan = normalise_tool_calls(calls, 3)
    assert plan.actions == ("do", "do", "do")
    assert _reasons(plan) == [("sleep", "more than 3 actions in one decision")]


@pytest.mark.parametrize(
    "calls", [None, [], [_openai("interact_many", {"actions": []})]], ids=["none", "empty", "no-items"]
)
def test_nothing_at_all_is_a_fallback_noop(calls: Any) -> None:
    plan = normalise_tool_calls(calls, MAX)
    assert plan.actions == ("noop",)
    assert plan.fallback_noop is True
    assert plan.rejected == ()


def test_nothing_valid_is_a_fallback_noop_with_every_reason() -> None:
    calls = [_openai("interact_many", {"actions": ["jump", 99]}), _openai("teleport", {}), _openai("interact", "{")]
    plan = normalise_tool_calls(calls, MAX)
    assert plan.actions == ("noop",)
    assert plan.fallback_noop is True
    assert _reasons(plan) == [
        ("jump", "unknown action"),
        ("99", "unknown action"),
        ("teleport", "unknown tool"),
        ("{", "arguments are not valid JSON"),
    ]
    assert [rejection.as_dict() for rejection in plan.rejected][0] == {"item": "jump", "reason": "unknown action"}


def test_an_explicit_noop_is_not_a_fallback() -> None:
    plan = normalise_tool_calls([_openai("interact_many", {"actions": ["noop"]})], MAX)
    assert plan.actions == ("noop",) and plan.fallback_noop is False


def test_long_rejected_items_are_shortened() -> None:
    plan = normalise_tool_calls([_openai("interact_many", {"actions": ["x" * 500]})], MAX)
    assert len(plan.rejected[0].item) == 80
    assert plan.rejected[0].item.endswith("...")


def test_the_recorded_tool_call_is_the_normalised_one() -> None:
    plan = normalise_tool_calls([{"tool": "interact", "args": {"action": 3}}], MAX)
    assert plan.tool_call() == {"tool_name": "interact_many", "arguments": {"actions": ["move_up"]}}
    assert plan_from_names(["do", "sleep"], MAX).actions == ("do", "sleep")


@pytest.mark.parametrize(
    ("item", "name"),
    [
        ("do", "do"),
        (" Move_Left ", "move_left"),
        (0, "noop"),
        (16, "make_iron_sword"),
        (17, None),
        (-1, None),
        (True, None),
        (1.0, None),
        ("", None),
        (None, None),
        (["do"], None),
    ],
)
def test_action_name(item: object, name: str | None) -> None:
    assert action_name(item) == name
