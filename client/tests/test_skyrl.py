"""SkyRL-gym with the real skyrl-gym (the `.ci/adapters-skyrl` virtualenv), against a live app: its
registry builds `crafter` as SkyRL's generator does (`skyrl_gym.make(id, env_config=..., extras=...)`)
and the env is stepped with model replies to `done`."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import KEY, App, trainer_library

pytestmark = pytest.mark.e2e
skyrl_gym = trainer_library("skyrl_gym")


def _make(app: App, extras: dict[str, Any], **settings: Any) -> Any:
    from task_app_client import skyrl

    skyrl.register()
    skyrl.register()  # a second call is harmless (every Ray worker registers)
    env_config = {"base_url": app.base_url, "api_key": KEY, **settings}
    return skyrl_gym.make("crafter", env_config=env_config, extras=extras)


def test_the_registry_builds_crafter_and_it_plays_to_done(app: App) -> None:
    from skyrl_gym.envs.base_text_env import BaseTextEnv

    env = _make(app, {"task_id": "crafter/eval/4"}, config={"length": 5})
    assert isinstance(env, BaseTextEnv)
    conversation, info = env.init([{"role": "user", "content": "Play Crafter."}])
    assert [message["role"] for message in conversation] == ["system", "user"]
    assert conversation[1]["content"].startswith("Play Crafter.\n\nStep 0/5")
    assert info["task_id"] == "crafter/eval/4"

    replies = [
        "I will gather wood. [move_left, do]",
        '<tool_call>{"name": "interact_many", "arguments": {"actions": ["do", "noop"]}}</tool_call>',
        '{"actions": ["do"]}',
    ]
    outputs = [env.step(reply) for reply in replies]
    assert [output["done"] for output in outputs] == [False, False, True]  # 5 actions: the world's length
    assert outputs[0]["metadata"]["actions"] == ["move_left", "do"]
    assert outputs[1]["metadata"]["actions"] == ["do", "noop"]
    assert outputs[0]["observations"][0]["role"] == "user"
    assert outputs[0]["observations"][0]["content"].startswith("Ran move_left, do.")
    assert outputs[2]["observations"] == [] and outputs[2]["metadata"]["truncated"] is True
    metrics = env.get_metrics()
    assert metrics["steps"] == 3
    assert metrics["return"] == pytest.approx(sum(output["reward"] for output in outputs))
    env.close()  # the generator closes every env; the session ended already
    assert type(env).aggregate_metrics([metrics, metrics])["steps"] == 3


def test_max_turns_ends_an_episode_and_terminates_its_session(app: App) -> None:
    from task_app_client import Env, GoneError, NotFoundError
    from task_app_client._results import EnvState, Observation

    env = _make(app, {"seed": 9}, max_turns=2, observation="full")
    _, info = env.init([])
    first = env.step("[noop]")
    second = env.step("no bracketed list at all")  # nothing to run: the server runs noop and says so
    assert (first["done"], second["done"]) == (False, True)
    assert second["metadata"]["actions"] == ["noop"] and second["metadata"]["truncated"] is True
    with app.client() as client, pytest.raises((NotFoundError, GoneError)):
        Env(client, EnvState(env_id=info["env_id"], observation=Observation())).step("noop")


def test_the_docs_example_runs(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/trainers/skyrl.md's Python block, as written (TASK_APP_URL and ENVIRONMENT_API_KEY set)."""
    import re

    from conftest import REPO

    page = (REPO / "docs" / "trainers" / "skyrl.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```python\n(.*?)```", page, re.S)
    monkeypatch.setenv("TASK_APP_URL", app.base_url)
    monkeypatch.setenv("ENVIRONMENT_API_KEY", KEY)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(block, "docs/trainers/skyrl.md", "exec"), namespace)
    assert namespace["output"]["metadata"]["actions"] == ["move_left", "do"]
