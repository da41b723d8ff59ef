"""The Crafter game layer: worlds and their cache, actions, observations, traits."""

from .actions import ACHIEVEMENTS, ACTION_IDS, ACTIONS, TOOL_NAME, ActionPlan, normalise_tool_calls
from .episode import DecisionOutcome, Game, warm_up
from .observation import VITALS, Observation
from .traits import WorldTraits, world_traits
from .worlds import GameEnv, WorldFactory

__all__ = [
    "ACHIEVEMENTS",
    "ACTIONS",
    "ACTION_IDS",
    "TOOL_NAME",
    "VITALS",
    "ActionPlan",
    "DecisionOutcome",
    "Game",
    "GameEnv",
    "Observation",
    "WorldFactory",
    "WorldTraits",
    "normalise_tool_calls",
    "warm_up",
    "world_traits",
]
