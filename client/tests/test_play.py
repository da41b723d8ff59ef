"""What the adapters share (task_app_client/_play.py): reading actions out of a model's text reply, and
the text a model reads after a step. No server needed."""

from __future__ import annotations

import pytest

from task_app_client import StepResult
from task_app_client._play import ACTIONS, TEXT_INSTRUCTIONS, Tally, parse_actions, step_text


@pytest.mark.parametrize(
    ("reply", "actions"),
    [
        ("Wood first. [move_left, do]", ["move_left", "do"]),
        ("I see [a tree] ahead, so: [move_left, 'do']", ["move_left", "do"]),
        ('<tool_call>{"name": "interact_many", "arguments": {"actions": ["do", "noop"]}}</tool_call>', ["do", "noop"]),
        ('<tool_call>{"name": "interact_many", "arguments": "{\\"actions\\": [\\"sleep\\"]}"}</tool_call>', ["sleep"]),
        ('{"actions": ["move_up"]}', ["move_up"]),
        ('{"action": "noop"}', ["noop"]),
        ("[fly, do]", ["fly", "do"]),  # the server refuses `fly` and says why
        ("no list here", []),
        ("[1, 2]", []),
        ("", []),
    ],
)
def test_parse_actions(reply: str, actions: list[str]) -> None:
    assert parse_actions(reply) == actions


def test_the_instructions_name_every_action() -> None:
    assert all(action in TEXT_INSTRUCTIONS for action in ACTIONS) and len(ACTIONS) == 17


def test_step_text_and_tally() -> None:
    step = StepResult.model_validate(
        {
            "observation": {"text": "Step 2/10000, day"},
            "done": True,
            "reward": 1.0,
            "info": {
                "actions": ["move_left", "do"],
                "rejected": [{"item": "fly", "reason": "unknown action"}],
                "achievements_added": ["collect_wood"],
            },
        }
    )
    assert step_text(step).splitlines() == [
        "Ran move_left, do. refused fly (unknown action). reward +1. unlocked collect_wood.",
        "Step 2/10000, day",
        "The episode is over.",
    ]
    tally = Tally()
    tally.add(step)
    tally.add(step)
    assert (tally.total, tally.steps, tally.achievements, tally.done) == (2.0, 2, ["collect_wood"], True)
