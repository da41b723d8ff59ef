"""Env sessions against a live app: create, step (names, OpenAI chat and Responses tool calls),
snapshot, restore, branch, reset, terminate, the context managers, errors, and a real 429 retried."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import KEY, App, FakeModelProcess, serve_app

from task_app_client import (
    AsyncClient,
    AuthenticationError,
    BadRequestError,
    Client,
    NotFoundError,
    RateLimitError,
    RetryPolicy,
)

pytestmark = pytest.mark.e2e


def test_an_env_session_from_create_to_terminate(client: Client) -> None:
    with client.env(seed=3, rl_run_id="client-test") as env:
        assert env.observation.text.startswith("Step 0/")
        assert (env.info.seed, env.step_idx, env.done) == (3, 0, False)
        assert env.observation.inventory["health"] == 9
        step = env.step(["move_left", "do"])
        assert step.info.actions == ["move_left", "do"]
        assert (step.step_idx, env.step_idx, env.reward) == (2, 2, step.reward)
        assert env.observation.text.startswith("Step 2/")

        snapshot = env.snapshot()
        assert snapshot.rl_run_id == "client-test" and snapshot.size > 0
        env.step("noop")
        with client.restore(snapshot.snapshot_id) as restored:
            assert restored.env_id != env.env_id
            assert restored.step_idx == 2
            assert restored.observation.text.startswith("Step 2/")

        children = env.branch(2)
        assert len(children) == 2 and len({child.env_id for child in children}) == 2
        for child in children:
            assert child.step_idx == env.step_idx
            assert child.step("noop").step_idx == env.step_idx + 1
            child.terminate()
            assert child.terminated

        reset = env.reset(seed=5)
        assert (reset.info.seed, reset.step_idx, env.step_idx) == (5, 0, 0)
    assert env.terminated
    env.terminate()  # a second terminate is a no-op
    with pytest.raises(NotFoundError) as caught:
        env.step("noop")
    error = caught.value
    assert (error.status, error.code, error.retryable) == (404, "env_not_found", False)
    assert error.details["env_id"] == env.env_id


def test_the_block_terminates_the_env_when_it_raises(client: Client) -> None:
    with pytest.raises(KeyError), client.env(seed=1) as env:
        env.step("noop")
        raise KeyError("the trainer failed")
    assert env.terminated
    with pytest.raises(NotFoundError):
        env.step("noop")


def test_an_env_already_gone_does_not_fail_the_block(client: Client) -> None:
    with client.env(seed=1) as env:
        other = Client(client.base_url, KEY)
        with other:
            other._run(env._terminate(None))  # ended behind the Env's back (another process)
        env.terminated = False
    assert env.terminated


def _chat_tool_calls(model: FakeModelProcess) -> list[dict[str, object]]:
    """A real chat completion from the loopback fake model: its `tool_calls`, as an agent loop gets them."""
    answer = httpx.post(model.url(), json={"model": "fake-model", "messages": []}, timeout=10.0, trust_env=False)
    calls: list[dict[str, object]] = answer.json()["choices"][0]["message"]["tool_calls"]
    return calls


def test_a_models_tool_calls_step_the_env_in_chat_and_responses_shapes(
    client: Client, fake_model: FakeModelProcess
) -> None:
    with client.env(seed=2) as env:
        chat = _chat_tool_calls(fake_model)
        assert env.step(tool_calls=chat).info.actions == ["move_left", "do"]

        function = chat[0]["function"]
        assert isinstance(function, dict)
        responses_output = [
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": function["name"],
                "arguments": function["arguments"],
            },
        ]
        step = env.step(tool_calls=responses_output)
        assert step.info.actions == ["move_left", "do"] and step.info.rejected == []

        unknown = [{"type": "function_call", "call_id": "c", "name": "fly", "arguments": json.dumps({})}]
        refused = env.step(tool_calls=unknown)
        assert refused.info.noop_fallback and refused.info.actions == ["noop"]
        assert [(item.item, item.reason) for item in refused.info.rejected] == [("fly", "unknown tool")]


def test_bad_input_and_a_wrong_key_carry_the_servers_code(app: App, client: Client) -> None:
    with pytest.raises(BadRequestError) as caught:
        client.env(seed=-1)
    assert (caught.value.status, caught.value.code) == (422, "seed_out_of_range")
    with pytest.raises(BadRequestError) as caught:
        client.env(seed=1, config={"area": [1, 1]})
    assert caught.value.code == "invalid_env_config"
    with Client(app.base_url, "not-the-key") as stranger, pytest.raises(AuthenticationError) as denied:
        stranger.env(seed=1)
    assert (denied.value.status, denied.value.code, denied.value.retryable) == (401, "unauthorized", False)


def test_the_async_env_session(app: App, fake_model: FakeModelProcess) -> None:
    async def main() -> None:
        async with AsyncClient(app.base_url, KEY) as client:
            async with client.env(seed=3) as env:
                step = await env.step(["move_left", "do"])
                assert step.info.actions == ["move_left", "do"] and env.step_idx == 2
                snapshot = await env.snapshot()
                async with client.restore(snapshot.snapshot_id) as restored:
                    assert restored.step_idx == 2
                (child,) = await env.branch(1)
                await child.step(tool_calls=_chat_tool_calls(fake_model))
                await child.terminate()
                assert (await env.reset(seed=4)).info.seed == 4
            assert env.terminated
            with pytest.raises(NotFoundError):
                await env.step("noop")

            plain = await client.env(seed=1)
            with pytest.raises(ZeroDivisionError):
                async with plain:
                    raise ZeroDivisionError
            assert plain.terminated

    asyncio.run(main())


@pytest.fixture(scope="module")
def one_env_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    """An app whose state store holds one env: the second create gets 429 `too_many_envs`."""
    with serve_app(Path(tmp_path_factory.mktemp("one-env")), sessions_max_envs="1") as served:
        yield served


def test_create_waits_out_a_real_429_until_an_env_is_free(one_env_app: App) -> None:
    with one_env_app.client() as client:
        first = client.env(seed=1)
        with one_env_app.client(retry=RetryPolicy.never()) as impatient, pytest.raises(RateLimitError) as caught:
            impatient.env(seed=2)
        refused = caught.value
        assert (refused.code, refused.retryable, refused.retry_after) == ("too_many_envs", True, 5.0)

        freeing = threading.Timer(1.0, first.terminate)
        freeing.start()
        started = time.monotonic()
        try:
            with client.env(seed=2) as second:  # /create is retried because the server says retryable
                assert second.info.seed == 2
        finally:
            freeing.join()
        assert time.monotonic() - started >= 5.0  # the server's Retry-After
