"""TRL's `environment_factory` contract with the real trl and transformers (the `.ci/adapters-trl`
virtualenv), against a live app: the tool schema as TRL renders it, and episodes driven the way
`GRPOTrainer` drives them (trl/trainer/grpo_trainer.py: the probe and pool in `__init__`, `reset(**row)`
and the per-rollout tool dicts in `_generate`, the calls and their error handling in `_tool_call_loop`,
the env's reward column from `get_reward`)."""

from __future__ import annotations

import gc
import inspect
import json
import pickle
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import KEY, App, serve_app, trainer_library

from task_app_client import RateLimitError, RetryPolicy
from task_app_client.trl import CrafterEnv, crafter_env_factory

pytestmark = pytest.mark.e2e
trl = trainer_library("trl")
transformers = trainer_library("transformers")

SHORT_WORLD = {"length": 6}  # crafter's step limit: the episode ends (truncated) after 6 actions


def _tools_of(environment: object) -> dict[str, Any]:
    """The environment's tools as GRPOTrainer collects them (public functions but reset / get_reward)."""
    return {
        name: getattr(environment, name)
        for name, _ in inspect.getmembers(type(environment), predicate=inspect.isfunction)
        if name not in ("reset", "get_reward") and not name.startswith("_")
    }


def _call_tool(tools: dict[str, Any], call: dict[str, Any]) -> tuple[str, Any]:
    """One tool call as `_tool_call_loop` runs it: an exception becomes `{"error": str(e)}` for the model."""
    function = call["function"]
    try:
        return function["name"], tools[function["name"]](**function["arguments"])
    except Exception as error:  # noqa: BLE001 - TRL's own handling, reproduced
        return function["name"], {"error": str(error)}


def _tool_call(*actions: str) -> dict[str, Any]:
    """A parsed tool call as TRL's response parser hands it over (arguments already a dict)."""
    return {"type": "function", "function": {"name": "interact_many", "arguments": {"actions": list(actions)}}}


def test_the_tool_schema_is_transformers_own(app: App) -> None:
    """transformers builds the schema TRL puts in the prompt from the type hints and the docstring."""
    environment = CrafterEnv(app.base_url, KEY)
    tools = _tools_of(environment)
    assert list(tools) == ["interact_many"]
    schema = transformers.utils.get_json_schema(tools["interact_many"])
    function = schema["function"]
    assert function["name"] == "interact_many"
    assert function["description"].startswith("Run actions in the Crafter world")
    actions = function["parameters"]["properties"]["actions"]
    assert actions["type"] == "array"
    assert actions["items"] == {"type": "string"}
    assert "move_left" in actions["description"] and "make_iron_sword" in actions["description"]
    assert function["parameters"]["required"] == ["actions"]


def test_the_chat_template_renders_the_tool(app: App) -> None:
    """A tokenizer's chat template receives the bound method as TRL passes it (`tools=[...]`)."""
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "<eos>": 1}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    template = (
        "{% for tool in tools %}TOOL {{ tool | tojson }}\n{% endfor %}"
        "{% for message in messages %}{{ message.role }}: {{ message.content }}\n{% endfor %}"
    )
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<eos>", chat_template=template
    )
    environment = CrafterEnv(app.base_url, KEY)
    observation = environment.reset(seed=3)
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Play.\n" + observation}],
        tools=list(_tools_of(environment).values()),
        tokenize=False,
    )
    (line,) = [line for line in rendered.splitlines() if line.startswith("TOOL ")]
    tool = json.loads(line.removeprefix("TOOL "))
    assert tool["function"]["name"] == "interact_many"
    assert "Map around you" in rendered


def test_an_episode_driven_as_grpo_trainer_drives_it(app: App) -> None:
    factory = crafter_env_factory(app.base_url, KEY, config=SHORT_WORLD)
    factory = pickle.loads(pickle.dumps(factory))  # AsyncGRPOTrainer sends the factory to a child process
    probe = factory()
    members = {name for name, _ in inspect.getmembers(type(probe), predicate=inspect.isfunction)}
    assert {"reset", "get_reward", "interact_many"} <= members

    pool = [probe, factory()]  # one instance per rollout slot, reused across batches
    rows = [
        {"prompt": [{"role": "user", "content": "Play Crafter."}], "task_id": "crafter/eval/3"},
        {"prompt": [{"role": "user", "content": "Play Crafter."}], "seed": 11},
    ]
    for _ in range(2):  # two batches on the same pooled instances
        prompts = []
        for environment, row in zip(pool, rows, strict=True):
            observation = environment.reset(**row)
            assert isinstance(observation, str)
            prompts.append(row["prompt"][-1]["content"] + observation)
        assert pool[0].env_id is not None and "Step 0/6" in prompts[0]

        environment, tools = pool[0], _tools_of(pool[0])
        results = [_call_tool(tools, _tool_call("move_left", "do", "fly")) for _ in range(3)]
        first = results[0][1]
        assert first.startswith("Ran move_left, do. refused fly (unknown action)")
        assert "Map around you" in first
        assert results[2][1].endswith("The episode is over.")  # 6 actions: crafter's length
        assert environment.env_id is None  # the ended episode's session is terminated

        name, after = _call_tool(tools, _tool_call("noop"))  # the model calls again: TRL feeds the error back
        assert name == "interact_many"
        assert after == {"error": "The episode is over. Do not call interact_many again."}

        rewards = [each.get_reward() for each in pool]  # the env's reward column (GRPOTrainer's get_reward)
        assert all(isinstance(reward, float) for reward in rewards)
        assert rewards[0] == pytest.approx(environment.tally.total)


def test_a_string_of_one_action_is_one_action(app: App) -> None:
    environment = CrafterEnv(app.base_url, KEY)
    environment.reset(seed=2)
    assert environment.interact_many("noop").startswith("Ran noop.")  # type: ignore[arg-type]


def test_the_url_and_key_come_from_the_environment(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    """`environment_factory=CrafterEnv`: TRL calls the class with no arguments."""
    monkeypatch.setenv("TASK_APP_URL", app.base_url)
    monkeypatch.setenv("ENVIRONMENT_API_KEY", KEY)
    environment = CrafterEnv()
    assert "Step 0/" in environment.reset(task_id="crafter/train/5")


@pytest.fixture(scope="module")
def one_env_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    """An app whose state store holds one env: a second env is refused with 429 until the first ends."""
    with serve_app(Path(tmp_path_factory.mktemp("one-env")), sessions_max_envs="1") as served:
        yield served


def test_reset_waits_out_429s_and_dropped_envs_are_terminated(one_env_app: App) -> None:
    holder = [CrafterEnv(one_env_app.base_url, KEY)]
    holder[0].reset(seed=1)
    with pytest.raises(RateLimitError) as refused:  # the app is full: an impatient env is refused
        CrafterEnv(one_env_app.base_url, KEY, retry=RetryPolicy.never()).reset(seed=2)
    assert (refused.value.code, refused.value.retryable) == ("too_many_envs", True)

    patient = CrafterEnv(one_env_app.base_url, KEY)
    dropping = threading.Timer(1.0, holder.clear)  # the trainer drops the first env: its finalizer ends it
    dropping.start()
    started = time.monotonic()
    try:
        assert "Step 0/" in patient.reset(seed=2)  # retried as the 429's Retry-After says, then served
    finally:
        dropping.join()
    assert time.monotonic() - started >= 1.0
    patient.reset(seed=3)  # the previous rollout's env is terminated first, so the one slot is free again
    del patient
    gc.collect()
