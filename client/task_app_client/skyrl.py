"""SkyRL-gym: `CrafterTextEnv`, a `BaseTextEnv` on the app's env sessions, registered as `crafter`
(docs/trainers/skyrl.md). Needs `task-app-client[skyrl]`.

SkyRL's generator builds one env per trajectory with `env_config` (the `crafter` section of its
environment config) and `extras` (the dataset row's fields), calls `init(prompt)`, then `step(reply)`
with each model reply until `done`, then `close()`. Text in, OpenAI messages out: the reply's actions
are read as `[move_left, do]`, `{"actions": [...]}` or an `interact_many` `<tool_call>`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
from skyrl_gym.envs.registration import register as _register
from skyrl_gym.envs.registration import registry

from ._client import Client, Env
from ._play import TEXT_INSTRUCTIONS, Tally, parse_actions, step_text
from .trl import TRAINER_RETRY, TRAINER_TIMEOUT

ENV_ID = "crafter"
ENTRY_POINT = "task_app_client.skyrl:CrafterTextEnv"
DEFAULT_MAX_TURNS = 50


def register(env_id: str = ENV_ID) -> None:
    """Register `CrafterTextEnv` with SkyRL-gym under `env_id` (`skyrl_gym.make("crafter", ...)`);
    calling it again is harmless."""
    if env_id not in registry:
        _register(id=env_id, entry_point=ENTRY_POINT)


def _setting(config: Any, name: str, default: Any = None) -> Any:
    """A field of SkyRL's env_config (an omegaconf DictConfig or a plain mapping)."""
    if config is None:
        return default
    if isinstance(config, Mapping):
        return config.get(name, default)
    return getattr(config, name, default)


class CrafterTextEnv(BaseTextEnv):  # type: ignore[misc]
    """One Crafter episode per trajectory.

    `env_config`: `base_url`, `api_key` (default `TASK_APP_URL`, `ENVIRONMENT_API_KEY`), `observation`
    ("full" or "compact"), `max_turns` (50), `config` (the world's: `length`, `area`).
    `extras`: the row's `task_id` (`crafter/eval/3`) or `seed`; with neither, a random train world.
    """

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        extras = extras or {}
        self.max_turns = int(_setting(env_config, "max_turns", DEFAULT_MAX_TURNS))
        self.observation_format = _setting(env_config, "observation", "full")
        self.task_id: str | None = extras.get("task_id")
        self.seed: int | None = extras.get("seed")
        self.world_config = dict(_setting(env_config, "config", None) or {})
        self._client = Client(
            _setting(env_config, "base_url"),
            _setting(env_config, "api_key"),
            retry=TRAINER_RETRY,
            timeout=TRAINER_TIMEOUT,
        )
        self._env: Env | None = None
        self.tally = Tally()

    def init(self, prompt: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Open the env session; the first observation joins the prompt (a system message with the
        rules is added when the prompt has none)."""
        self._env = self._client.env(
            self.seed, task_id=self.task_id, config=self.world_config, observation=self.observation_format
        )
        conversation = [dict(message) for message in prompt or []]
        if not any(message.get("role") == "system" for message in conversation):
            conversation.insert(0, {"role": "system", "content": TEXT_INSTRUCTIONS})
        text = self._env.observation.text
        if conversation[-1].get("role") == "user":
            conversation[-1]["content"] = f"{conversation[-1]['content']}\n\n{text}".strip()
        else:
            conversation.append({"role": "user", "content": text})
        return conversation, {
            "env_id": self._env.env_id,
            "task_id": self._env.info.task_id,
            "seed": self._env.info.seed,
        }

    def step(self, action: str) -> BaseTextEnvStepOutput:
        if self._env is None:
            raise RuntimeError("init() opens the episode before the first step")
        self.turns += 1
        step = self._env.step(parse_actions(action))
        self.tally.add(step)
        done = step.done or self.turns >= self.max_turns
        metadata = {
            "actions": step.info.actions,
            "rejected": [each.item for each in step.info.rejected],
            "achievements_added": step.info.achievements_added,
            "terminated": step.info.terminated,
            "truncated": bool(step.truncated) or (done and not step.done),
        }
        if done:
            self.close()
            observations: list[dict[str, str]] = []
        else:
            observations = [{"role": "user", "content": step_text(step)}]
        return BaseTextEnvStepOutput(
            observations=observations, reward=float(step.reward or 0.0), done=done, metadata=metadata
        )

    def close(self) -> None:
        """End the env session (idempotent) and the client's connections."""
        env, self._env = self._env, None
        try:
            if env is not None:
                env.terminate()
        finally:
            self._client.close()

    def get_metrics(self) -> dict[str, Any]:
        return {
            "return": self.tally.total,
            "achievements": len(self.tally.achievements),
            "steps": self.tally.steps,
        }
