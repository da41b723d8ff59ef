"""Rollouts, runs and task info against a live app: the built-in scripted policy and, where a model
is needed, the loopback fake model; a real capacity 429 retried."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import KEY, App, FakeModelProcess, serve_app

from task_app_client import (
    AsyncClient,
    BadRequestError,
    Client,
    NotFoundError,
    RateLimitError,
    RetryPolicy,
    RunNotFinished,
    TaskInfo,
    TaskSet,
    rollout_request,
)

pytestmark = pytest.mark.e2e


def test_a_scripted_rollout_and_its_replay(client: Client) -> None:
    request = rollout_request(seed=3, decisions=3)
    result = client.rollout(request)
    assert result.run_id == request.run_id and not result.aborted
    assert result.metrics.num_steps == 3
    (trajectory,) = result.trajectories
    assert len(trajectory.steps) == 3 and trajectory.steps[0].tool_calls[0]["tool_name"] == "interact_many"
    assert result.achievements == result.metrics.details["achievements"]
    again = client.rollout(request)  # the same run_id: the server answers with the first run's response
    assert again == result


def test_a_rollout_against_the_fake_model(client: Client, fake_model: FakeModelProcess) -> None:
    config = {"model": "fake-model", "inference_url": fake_model.url()}
    result = client.rollout(rollout_request(seed=1, policy="crafter-react", policy_config=config, decisions=2))
    (trajectory,) = result.trajectories
    assert trajectory.inference_url.startswith(fake_model.base_url)
    assert [step.tool_calls[0]["arguments"]["actions"] for step in trajectory.steps] == [["move_left", "do"]] * 2


def test_submit_result_status_and_a_repeated_submission(client: Client) -> None:
    request = rollout_request(seed=2, decisions=2)
    (submitted,) = client.submit(request)
    assert submitted.accepted and submitted.run_id == request.run_id
    result = client.result(request.run_id)
    assert result.metrics.num_steps == 2
    status = client.status(request.run_id)
    assert status.finished and status.status == "completed"
    (repeated,) = client.submit(request)
    assert not repeated.accepted and repeated.status == "completed"


def test_a_group_runs_together_and_answers_in_order(client: Client) -> None:
    requests = [rollout_request(seed=seed, decisions=2) for seed in (4, 5, 6)]
    results = client.group(requests)
    assert [result.run_id for result in results] == [request.run_id for request in requests]
    assert all(result.metrics.num_steps == 2 for result in results)


def test_abort_and_a_result_that_is_not_there_yet(client: Client) -> None:
    request = rollout_request(seed=7, decisions=2000)
    client.submit(request)
    with pytest.raises(RunNotFinished) as caught:
        client.result(request.run_id, timeout=0.5)
    assert caught.value.run.status in ("queued", "running")
    aborted = client.abort(request.run_id)
    assert aborted.ok and aborted.run_id == request.run_id
    result = client.result(request.run_id, timeout=60)
    assert result.aborted and result.metrics.num_steps < 2000
    assert client.status(request.run_id).status == "aborted"


def test_unknown_runs_and_bad_requests_carry_the_servers_code(client: Client) -> None:
    with pytest.raises(NotFoundError) as missing:
        client.status("no-such-run")
    assert missing.value.code == "run_not_found" and missing.value.details["run_id"] == "no-such-run"
    with pytest.raises(NotFoundError):
        client.result("no-such-run")
    with pytest.raises(BadRequestError) as caught:
        client.rollout({"run_id": "bad-1", "mode": "eval"})
    assert caught.value.code == "invalid_request"
    assert {tuple(error["loc"]) for error in caught.value.details["errors"]} >= {("body", "env"), ("body", "policy")}


def test_info_and_task_info(client: Client) -> None:
    info = client.info()
    assert info.limits["max_actions_per_decision"] == 8 and info.inference["tool"]["name"] == "interact_many"
    taskset = client.task_info()
    assert isinstance(taskset, TaskSet) and "train" in taskset.splits and taskset.seed_range is not None
    one = client.task_info(seed=3)
    assert isinstance(one, TaskInfo) and one.seed == 3 and "move_left" in one.actions
    several = client.task_info(seeds=[1, 2])
    assert [each.seed for each in several] == [1, 2]


def test_the_async_rollout_api(app: App, fake_model: FakeModelProcess) -> None:
    async def main() -> None:
        async with AsyncClient(app.base_url, KEY) as client:
            config = {"model": "fake-model", "inference_url": fake_model.url()}
            modelled = rollout_request(seed=1, policy="crafter-react", policy_config=config, decisions=1)
            scripted = [rollout_request(seed=seed, decisions=2) for seed in (8, 9)]
            one, group = await asyncio.gather(client.rollout(modelled), client.group(scripted))
            assert one.trajectories[0].steps[0].tool_calls[0]["arguments"]["actions"] == ["move_left", "do"]
            assert [result.run_id for result in group] == [request.run_id for request in scripted]
            (submitted,) = await client.submit(rollout_request(seed=3, decisions=1))
            assert (await client.result(submitted.run_id)).metrics.num_steps == 1
            assert (await client.status(submitted.run_id)).finished
            assert (await client.abort(submitted.run_id)).status == "completed"
            assert (await client.task_info(seed=5)).seed == 5
            assert "train" in (await client.task_info()).splits
            assert (await client.info()).limits

    asyncio.run(main())


@pytest.fixture(scope="module")
def one_slot_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    """An app that runs one rollout at a time: a second /rollout gets 429 `capacity_exceeded`."""
    with serve_app(Path(tmp_path_factory.mktemp("one-slot")), max_concurrent_rollouts="1") as served:
        yield served


def test_a_rollout_waits_out_a_real_capacity_429(one_slot_app: App) -> None:
    with one_slot_app.client() as client:
        long = rollout_request(seed=1, decisions=2000)
        client.submit(long)
        deadline = time.monotonic() + 30
        while client.status(long.run_id).status != "running":
            assert time.monotonic() < deadline, "the long run did not start"
            time.sleep(0.05)  # polling interval
        with one_slot_app.client(retry=RetryPolicy.never()) as impatient, pytest.raises(RateLimitError) as caught:
            impatient.rollout(rollout_request(seed=2, decisions=1))
        assert (caught.value.code, caught.value.retryable, caught.value.retry_after) == ("capacity_exceeded", True, 1.0)
        assert caught.value.details == {"active": 1, "limit": 1}

        started = time.monotonic()
        timer = threading.Timer(1.5, client.abort, args=(long.run_id,))  # frees the slot for the retries
        timer.start()
        try:
            result = client.rollout(rollout_request(seed=2, decisions=1))
        finally:
            timer.join()
        assert result.metrics.num_steps == 1
        assert time.monotonic() - started >= 1.5
