"""The peer: crafter served by OpenEnv's own server, for B6 to measure beside the app.

    OPENENV_PYTHON=/path/to/venv/bin/python python -m benchmarks --only B6

Run by B6 with the interpreter `OPENENV_PYTHON` names (default: this one), in a virtualenv holding
`openenv` and the app (`.ci/openenv`'s recipe: `pip install -e '.[openenv]'`; openenv cannot live in
the dev virtualenv). Built as OpenEnv's docs recommend for a new environment: `Action`, `Observation`
and `State` models, an `Environment` subclass (`reset`, `step`, `state`) marked
`SUPPORTS_CONCURRENT_SESSIONS`, and `create_app(...)` served by uvicorn with the app's own options
(httptools, asyncio, no access log: `benchmarks.loopback`) but for WebSocket compression, on as in OpenEnv's
template (the app's server turns it off).

The environment plays the app's game layer (`task_app.game`: the same world generator, step and
observation text), so both servers do the same game work per step and the figures compare the serving
stacks. OpenEnv's HTTP `/reset` and `/step` make a new environment per request and close it after (its
stateless HTTP: `HTTPEnvServer.step_handler`), so an HTTP step on the peer plays one action on a fresh
episode of the seed; its WebSocket keeps one environment per connection, as the app's does.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from task_app.game import ActionPlan, Game, WorldFactory, normalise_tool_calls, warm_up

from .loopback import serve_on_loopback

WORLDS = WorldFactory(cache_size=64)
MAX_ACTIONS = 8


class CrafterAction(Action):
    actions: list[str | int] = Field(default_factory=list, max_length=64, description="names or ids, in order")


class CrafterObservation(Observation):
    text: str = ""
    inventory: dict[str, int] = Field(default_factory=dict)
    achievements_status: dict[str, bool] = Field(default_factory=dict)
    achievements_counts: dict[str, int] = Field(default_factory=dict)
    player_position: list[int] = Field(default_factory=list)
    player_direction: list[int] = Field(default_factory=list)
    semantic_map_patch7: list[list[int]] = Field(default_factory=list)
    num_steps_taken: int = 0
    max_steps_episode: int = 0
    terminated: bool = False
    truncated: bool = False


class CrafterEnvironment(Environment[CrafterAction, CrafterObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._game = Game(WORLDS.world(0))
        self._state = State(episode_id=None, step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> CrafterObservation:
        self._game.close()
        self._game = Game(WORLDS.world(seed or 0))
        self._state = State(episode_id=episode_id, step_count=0)
        return self._observation(0.0)

    def step(self, action: CrafterAction, timeout_s: float | None = None, **kwargs: Any) -> CrafterObservation:
        plan: ActionPlan = normalise_tool_calls(
            [{"tool_name": "interact_many", "arguments": {"actions": list(action.actions)}}], MAX_ACTIONS
        )
        outcome = self._game.apply(plan)
        self._state.step_count += 1
        return self._observation(sum(result.native_reward for result in outcome.results))

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        self._game.close()

    def _observation(self, reward: float) -> CrafterObservation:
        observation = self._game.observe()
        return CrafterObservation(**observation.data, text=observation.text, reward=reward, done=self._game.done)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="serve crafter through OpenEnv's own server (B6's peer)")
    parser.add_argument("--max-sessions", type=int, default=64, help="OpenEnv's max_concurrent_envs")
    args = parser.parse_args(argv)
    warm_up(WORLDS)
    app = create_app(
        CrafterEnvironment, CrafterAction, CrafterObservation, env_name="crafter", max_concurrent_envs=args.max_sessions
    )
    # WebSocket messages compressed: uvicorn's default, which OpenEnv's template serves with
    # (`uvicorn server.app:app`); the app's server turns it off (docs/decisions/websocket.md)
    return serve_on_loopback(app, lifespan="on", loop="asyncio", ws_per_message_deflate=True)


if __name__ == "__main__":
    sys.exit(main())
