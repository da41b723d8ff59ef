"""TRL: `CrafterEnv` for `GRPOTrainer(environment_factory=CrafterEnv)` (docs/trainers/trl.md).

TRL builds one env per rollout slot with no arguments, keeps them in a pool, calls `reset(**row)` at
the start of each rollout (a returned string joins the prompt), turns every public method into a tool
(its schema from the type hints and the Google-style docstring), and calls `get_reward()` once a
rollout ends. So the class has exactly one public method besides those two: the tool `interact_many`.

Each rollout plays one env session of the app. The session of the previous rollout is terminated when
the next `reset()` starts, when its episode ends, and when the object is collected or the process
exits. The client retries 429s (`too_many_live_envs`, `too_many_envs`) and 503s as the server's
`Retry-After` says, patiently enough that a busy app slows a training step instead of failing it.
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from ._client import Client, Env
from ._config import RetryPolicy, Timeout
from ._errors import TaskAppClientError
from ._play import EPISODE_OVER, Tally, step_text
from ._requests import ObservationFormat

logger = logging.getLogger("task_app_client.trl")

# A training step waits out a busy app rather than failing: up to 12 sends, waits growing to 30 s (or the
# server's Retry-After), within 10 minutes a call.
TRAINER_RETRY = RetryPolicy(attempts=12, backoff=1.0, max_backoff=30.0, jitter=0.5)
TRAINER_TIMEOUT = Timeout(connect=10.0, total=600.0)


class _Session:
    """The client and the live env of one `CrafterEnv`, apart from it so that a finalizer can end
    them without keeping the `CrafterEnv` alive."""

    def __init__(self, client: Client, owns_client: bool) -> None:
        self.client = client
        self.owns_client = owns_client
        self.env: Env | None = None

    def drop_env(self) -> None:
        env, self.env = self.env, None
        if env is not None and not env.terminated:
            try:
                env.terminate()
            except TaskAppClientError as exc:  # the session expires on the server in any case
                logger.warning("could not terminate env %s: %s", env.env_id, exc)

    def close(self) -> None:
        self.drop_env()
        if self.owns_client:
            self.client.close()


class CrafterEnv:
    """A Crafter episode for TRL's `environment_factory`: `reset(**row)`, the tool `interact_many`,
    `get_reward()`.

    The app is `base_url` with `api_key` (default: `TASK_APP_URL`, `ENVIRONMENT_API_KEY`), or an open
    `client` to share. `observation` is the text format ("full" or "compact"); `config` the world's
    (`length`: the episode's step limit, 10000 by default). A dataset row may carry
    `task_id` (`crafter/train/17`) or `seed`; with neither, each rollout gets a random train world.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        observation: ObservationFormat = "full",
        config: Mapping[str, Any] | None = None,
        client: Client | None = None,
        retry: RetryPolicy = TRAINER_RETRY,
        timeout: Timeout = TRAINER_TIMEOUT,
    ) -> None:
        owns_client = client is None
        if client is None:
            client = Client(base_url, api_key, retry=retry, timeout=timeout)
        self._session = _Session(client, owns_client)
        self._finalizer = weakref.finalize(self, self._session.close)
        self.observation_format: ObservationFormat = observation
        self.world_config = dict(config or {})
        self.tally = Tally()

    @property
    def env_id(self) -> str | None:
        """The env session of the current rollout (None before `reset()` and after the episode ended)."""
        env = self._session.env
        return env.env_id if env is not None else None

    def reset(self, **row: Any) -> str:
        """Start a new episode on the row's `task_id` or `seed` (else a random train world); returns
        the first observation's text, which TRL appends to the prompt."""
        self._session.drop_env()
        self.tally = Tally()
        task_id, seed = row.get("task_id"), row.get("seed")
        env = self._session.client.env(
            seed, task_id=task_id, config=self.world_config, observation=self.observation_format
        )
        self._session.env = env
        return env.observation.text

    def interact_many(self, actions: list[str]) -> str:
        """Run actions in the Crafter world, in order, and see the world after them.

        Args:
            actions: 1 to 8 action names, run in order, e.g. ["move_left", "do"]. The names: noop,
                move_left, move_right, move_up, move_down, do (collect, attack, drink or eat what you
                face), sleep, place_stone, place_table, place_furnace, place_plant, make_wood_pickaxe,
                make_stone_pickaxe, make_iron_pickaxe, make_wood_sword, make_stone_sword, make_iron_sword.

        Returns:
            What ran (and what was refused), the reward and achievements it brought, and the
            observation after it.
        """
        env = self._session.env
        if self.tally.done:
            raise ValueError(f"{EPISODE_OVER} Do not call interact_many again.")
        if env is None:
            raise RuntimeError("no episode: TRL calls reset() before the first tool call")
        given: object = actions  # a model may send one name as a string
        step = env.step([given] if isinstance(given, str) else list(actions))
        self.tally.add(step)
        if step.done:
            self._session.drop_env()
        return step_text(step)

    def get_reward(self) -> float:
        """The episode's return: crafter's reward summed over its steps (achievements unlocked, health)."""
        return self.tally.total


def crafter_env_factory(
    base_url: str | None = None,
    api_key: str | None = None,
    *,
    observation: ObservationFormat = "full",
    config: Mapping[str, Any] | None = None,
    retry: RetryPolicy = TRAINER_RETRY,
    timeout: Timeout = TRAINER_TIMEOUT,
) -> Callable[[], CrafterEnv]:
    """A no-argument factory of `CrafterEnv`s with these arguments, for `environment_factory=`.
    It pickles (AsyncGRPOTrainer sends the factory to a child process); each env opens its own client."""
    return functools.partial(
        CrafterEnv, base_url, api_key, observation=observation, config=config, retry=retry, timeout=timeout
    )
