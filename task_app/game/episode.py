"""One episode of Crafter driven by decisions: a decision executes up to N actions in order.

Blocking (CPU) work; callers run these methods in a worker thread, one thread at a time per game.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .actions import ACHIEVEMENTS, ACTION_IDS, ActionPlan
from .observation import Observation, observe
from .worlds import GameEnv, WorldFactory


@dataclass(frozen=True, slots=True)
class ActionResult:
    action: str
    unlocked: tuple[str, ...]
    native_reward: float

    def as_dict(self) -> dict[str, Any]:
        return {"action": self.action, "unlocked": list(self.unlocked), "native_reward": self.native_reward}


@dataclass(frozen=True, slots=True)
class DecisionOutcome:
    """What one decision did to the episode."""

    results: tuple[ActionResult, ...]
    unlocked: tuple[str, ...]  # achievements unlocked for the first time this episode
    terminated: bool  # the player died
    truncated: bool  # the episode length was reached
    counts_before: dict[str, int] = field(default_factory=dict)
    counts_after: dict[str, int] = field(default_factory=dict)
    inventory_before: dict[str, int] = field(default_factory=dict)
    inventory_after: dict[str, int] = field(default_factory=dict)

    @property
    def reward(self) -> float:
        """The decision reward: how many achievements it unlocked."""
        return float(len(self.unlocked))

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    @property
    def actions(self) -> list[str]:
        return [result.action for result in self.results]


class Game:
    """A Crafter episode: the env plus its end-of-episode flags."""

    def __init__(self, env: GameEnv, image_size: int | None = None, decision_limit: int | None = None) -> None:
        self.env = env
        self.image_size = image_size
        self.decision_limit = decision_limit  # decisions per episode before it is truncated
        self.decisions = 0
        self.terminated = False
        self.truncated = False

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    def close(self) -> None:
        """Done with this episode: its world's memory returns now (`GameEnv.release`)."""
        self.env.release()

    def achievements(self) -> list[str]:
        """Achievements unlocked so far this episode."""
        counts = self.env.player.achievements
        return [name for name in ACHIEVEMENTS if counts.get(name, 0) > 0]

    def observe(self) -> Observation:
        return observe(self.env, terminated=self.terminated, truncated=self.truncated, image_size=self.image_size)

    def apply(self, plan: ActionPlan) -> DecisionOutcome:
        """Execute the plan's actions in order; stop early when the episode ends."""
        player = self.env.player
        counts_before = dict(player.achievements)
        inventory_before = dict(player.inventory)
        results: list[ActionResult] = []
        for action in plan.actions:
            if self.done:
                break
            seen = {name for name, count in player.achievements.items() if count > 0}
            _, native_reward, done, _ = self.env.step(ACTION_IDS[action])
            unlocked = tuple(name for name in ACHIEVEMENTS if player.achievements[name] > 0 and name not in seen)
            results.append(ActionResult(action, unlocked, float(native_reward)))
            if done:
                self.terminated = player.health <= 0
                self.truncated = not self.terminated
        self.decisions += 1
        if self.decision_limit is not None and self.decisions >= self.decision_limit and not self.done:
            self.truncated = True
        unlocked_all = tuple(name for result in results for name in result.unlocked)
        return DecisionOutcome(
            results=tuple(results),
            unlocked=unlocked_all,
            terminated=self.terminated,
            truncated=self.truncated,
            counts_before=counts_before,
            counts_after=dict(player.achievements),
            inventory_before=inventory_before,
            inventory_after=dict(player.inventory),
        )

    def step(self, plan: ActionPlan) -> tuple[DecisionOutcome, Observation]:
        """Apply a decision and observe the result: the one call a rollout makes per env op."""
        outcome = self.apply(plan)
        return outcome, self.observe()


def warm_up(worlds: WorldFactory) -> None:
    """Compile (or load from numba's on-disk cache) every kernel of the game layer before the first
    rollout needs it: the world generator's and the observation's, on one small world."""
    Game(worlds.generate(0, (16, 16), 100)).observe()
