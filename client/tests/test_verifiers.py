"""The verifiers taskset `crafter_task_app` with the real verifiers 0.4 (the `.ci/adapters-verifiers`
virtualenv): `vf-eval` runs it for 2 eval tasks x 2 rollouts, the null harness in the subprocess
runtime, on the loopback fake model (streamed text replies `[move_left, do]`), against a live app."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import KEY, App, FakeModelProcess, child_environment, serve_fake_model, trainer_library

pytestmark = pytest.mark.e2e
vf = trainer_library("verifiers")

EVAL_TOML = """\
model = "fake-model"
num_rollouts = 2
push = false
output_dir = "{output}"

[client]
base_url = "{model_url}/v1"
api_key_var = "FAKE_MODEL_KEY"

[env.taskset]
id = "crafter_task_app"
split = "eval"
num_tasks = 2
max_turns = 3
observation = "full"

[env.player.harness]
id = "null"

[env.player.runtime]
type = "subprocess"
"""


@pytest.fixture(scope="module")
def text_model() -> Iterator[FakeModelProcess]:
    with serve_fake_model("text") as served:
        yield served


def test_the_package_is_a_taskset_and_an_env() -> None:
    from verifiers.v1.utils.loaders import environment_class, taskset_class

    import crafter_task_app

    assert taskset_class("crafter_task_app") is crafter_task_app.CrafterTaskset
    assert environment_class("crafter_task_app") is crafter_task_app.CrafterEnv


def test_the_tasks_are_the_apps_task_ids(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    import crafter_task_app

    monkeypatch.setenv("ENVIRONMENT_API_KEY", KEY)
    config = crafter_task_app.CrafterConfig(id="crafter_task_app", app_url=app.base_url, split="eval", start=5)
    taskset = crafter_task_app.CrafterTaskset(config)
    assert taskset.bounded
    tasks = list(taskset.take(3))
    assert [task.data.task_id for task in tasks] == ["crafter/eval/5", "crafter/eval/6", "crafter/eval/7"]
    assert "[move_left, move_left, do]" in tasks[0].data.system_prompt
    train = crafter_task_app.CrafterTaskset(crafter_task_app.CrafterConfig(id="crafter_task_app", app_url=app.base_url))
    assert not train.bounded  # two billion train worlds: a view must bound them
    assert [task.data.name for task in train.take(2)] == ["crafter/train/0", "crafter/train/1"]


def test_vf_eval_runs_two_tasks_two_rollouts(app: App, text_model: FakeModelProcess, tmp_path: Path) -> None:
    output = tmp_path / "outputs"
    config = tmp_path / "eval.toml"
    config.write_text(EVAL_TOML.format(output=output, model_url=text_model.base_url))
    vf_eval = Path(sys.executable).with_name("vf-eval")
    done = subprocess.run(
        [str(vf_eval), "@", str(config)],
        cwd=tmp_path,
        env=child_environment(
            TASK_APP_URL=app.base_url,
            ENVIRONMENT_API_KEY=KEY,
            FAKE_MODEL_KEY="unused",
            PYTHONPATH=os.environ.get("PYTHONPATH", ""),  # the client's sources, where the wheel is not installed
        ),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (traces_file,) = output.glob("*/traces.jsonl")
    episodes = [json.loads(line) for line in traces_file.read_text().splitlines()]
    assert (
        sorted(episode["task"]["data"]["task_id"] for episode in episodes)
        == ["crafter/eval/0"] * 2 + ["crafter/eval/1"] * 2
    )
    for episode in episodes:
        (trace,) = episode["traces"]
        assert trace["ok"], trace["errors"]
        assert set(trace["rewards"]) == {"crafter_return"}
        assert trace["metrics"]["env_steps"] == 3.0  # max_turns, each reply's [move_left, do] run
        assert trace["info"]["task_id"] == episode["task"]["data"]["task_id"]
        assert isinstance(trace["info"]["achievements"], list)
    from task_app_client import Env, GoneError, NotFoundError
    from task_app_client._results import EnvState, Observation

    with app.client() as client:  # every episode's env session was terminated
        for episode in episodes:
            ended = Env(client, EnvState(env_id=episode["traces"][0]["info"]["env_id"], observation=Observation()))
            with pytest.raises((NotFoundError, GoneError)):
                ended.step("noop")
