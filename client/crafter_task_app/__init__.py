"""The Crafter task app as a verifiers 0.4 taskset: `[env.taskset] id = "crafter_task_app"`
(docs/trainers/verifiers.md). Installed by `task-app-client[verifiers]`; prime-rl runs the same package.

One task per task id of the app's `train` or held-out `eval` split (`crafter/eval/17`). The env plays
the user: `run()` opens an env session on the task's world, sends its observation as the user turn,
runs the actions of each reply (`[move_left, do]`) and sends the next observation, until the episode
ends or `max_turns`; the return is the reward `crafter_return`, the achievements go into the trace's
info and metrics. The app's URL and key come from the config (the key only by the name of its
environment variable: task data is written into traces).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, Literal

import verifiers.v1 as vf
from pydantic import Field

from task_app_client import AsyncClient, Client, TaskSplit
from task_app_client._config import KEY_VARIABLE, URL_VARIABLE
from task_app_client._play import TEXT_INSTRUCTIONS, Tally, parse_actions, step_text
from task_app_client.trl import TRAINER_RETRY, TRAINER_TIMEOUT

__all__ = ["CrafterConfig", "CrafterData", "CrafterEnv", "CrafterEnvConfig", "CrafterTask", "CrafterTaskset"]


class CrafterConfig(vf.TasksetConfig):  # type: ignore[misc]
    app_url: str | None = None
    """The task app's URL; default: the `TASK_APP_URL` environment variable."""
    api_key_var: str = KEY_VARIABLE
    """The environment variable that holds the app's key (the key itself never enters a config)."""
    split: Literal["train", "eval"] = "train"
    """`train` (the app's training worlds) or `eval` (its held-out worlds)."""
    start: int = Field(default=0, ge=0)
    """The first task index of the split to yield."""
    num_tasks: int | None = Field(default=None, ge=1)
    """How many tasks to yield; None: the rest of the split (`train`'s two billion read as infinite)."""
    observation: Literal["full", "compact"] = "full"
    """The observation text's format."""
    max_turns: int = Field(default=50, ge=1)
    """Model turns per episode; the episode ends earlier when the player dies or at the world's length."""
    world_config: dict[str, Any] = Field(default_factory=dict)
    """The env's world config (`length`: crafter's step limit, 10000 by default)."""


class CrafterData(vf.TaskData):  # type: ignore[misc]
    task_id: str
    """The app's task id, e.g. `crafter/eval/17`."""
    app_url: str
    api_key_var: str
    observation: Literal["full", "compact"]
    max_turns: int
    world_config: dict[str, Any]


class CrafterTask(vf.Task[CrafterData]):  # type: ignore[misc]
    pass


class CrafterEnvConfig(vf.EnvConfig):  # type: ignore[misc]
    player: vf.AgentConfig = vf.AgentConfig()


def _app_url(config: CrafterConfig) -> str:
    url = config.app_url or os.environ.get(URL_VARIABLE)
    if not url:
        raise ValueError(f"crafter_task_app: set app_url in the taskset config or {URL_VARIABLE}")
    return url


class CrafterEnv(vf.Env[CrafterEnvConfig]):  # type: ignore[misc]
    async def run(self, task: CrafterTask, agents: Any) -> None:
        data: CrafterData = task.data
        tally = Tally()
        async with (
            AsyncClient(
                data.app_url, os.environ.get(data.api_key_var), retry=TRAINER_RETRY, timeout=TRAINER_TIMEOUT
            ) as client,
            client.env(task_id=data.task_id, config=data.world_config, observation=data.observation) as env,
            agents.player.interaction(task) as interaction,
        ):
            segment = await interaction.turn(env.observation.text)
            while not segment.terminated:
                step = await env.step(parse_actions(segment.last_reply))
                tally.add(step)
                if step.done or tally.steps >= data.max_turns:
                    break
                segment = await interaction.turn(step_text(step))
        trace = interaction.trace
        trace.record_reward("crafter_return", tally.total, 1.0)
        trace.record_metrics({"achievements": float(len(tally.achievements)), "env_steps": float(tally.steps)})
        trace.info.update(
            task_id=data.task_id, achievements=tally.achievements, episode_over=tally.done, env_id=env.env_id
        )


class CrafterTaskset(vf.Taskset[CrafterTask, CrafterConfig]):  # type: ignore[misc]
    def _split(self, url: str) -> TaskSplit:
        with Client(url, os.environ.get(self.config.api_key_var)) as client:
            return client.task_info().split(self.config.split)

    @property
    def bounded(self) -> bool:
        if self._bounded is not None:
            return bool(self._bounded)
        return self.config.num_tasks is not None or self.config.split == "eval"

    def load(self) -> Iterator[CrafterTask]:
        config = self.config
        url = _app_url(config)
        split = self._split(url)
        stop = split.num_tasks if config.num_tasks is None else min(split.num_tasks, config.start + config.num_tasks)
        for index in range(config.start, stop):
            task_id = split.task_id(index)
            yield CrafterTask(
                CrafterData(
                    id=task_id,
                    name=task_id,
                    prompt=None,
                    system_prompt=TEXT_INSTRUCTIONS,
                    task_id=task_id,
                    app_url=url,
                    api_key_var=config.api_key_var,
                    observation=config.observation,
                    max_turns=config.max_turns,
                    world_config=config.world_config,
                ),
                config.task,
            )
