"""What async trainers need from `/rollout` besides tokens: the policy version of each decision (and
the lag stop), answers a paused server aborted (retried) or held, the exclusion flag of every result,
and rollouts that continue from an env session or a snapshot (split and branched).

End to end against the loopback fake model (tests/support/fake_model.py) in its vLLM token mode.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from support.errors import error_body
from support.fake_model import FakeModel, Recorded, aborted, delay, error, gated, text, tool_call
from support.polling import wait_until
from support.rollouts import post_rollout, request_body
from support.servers import AppServer

from task_app.core.contracts import RolloutRequest
from task_app.core.errors import InvalidRequest
from task_app.core.settings import Settings
from task_app.policy.versions import CONFIG, HEADER, MODEL_NAME, PolicyVersion, policy_version
from task_app.rollout.failures import ERROR_CLASSES, ErrorClass, exclusion, failure
from task_app.rollout.plan import build_plan

pytestmark = pytest.mark.usefixtures("no_key_in_logs")

ROOMY = {"env_params": {"max_steps_per_episode": 100}}  # no decision cap ends an episode in these tests


def react(model: FakeModel, decisions: int, **overrides: Any) -> dict[str, Any]:
    body = request_body(inference_url=model.url(), decisions=decisions, **overrides)
    body["run_id"] = f"async-{uuid.uuid4().hex[:10]}"
    return body


def excluded(answer: dict[str, Any]) -> tuple[bool, str | None]:
    details = answer["metrics"]["details"]
    return details["exclude"], details["failure_kind"]


def metas(answer: dict[str, Any]) -> list[dict[str, Any]]:
    return [step["info"]["meta"] for step in answer["trajectories"][0]["steps"]]


# --- policy versions -------------------------------------------------------------------------------


def test_the_version_comes_from_the_header_then_the_model_name_then_the_config() -> None:
    assert policy_version("7", "lora-v3", 1) == PolicyVersion(7, HEADER)
    assert policy_version(None, "lora-v3", 1) == PolicyVersion(3, MODEL_NAME)
    assert policy_version("not-a-number", "lora", 1) == PolicyVersion(1, CONFIG)
    assert policy_version(None, "lora-v", None) is None


@pytest.mark.e2e
def test_each_decision_records_its_version_and_the_rollout_those_it_saw(
    client: httpx.Client, fake_model: FakeModel
) -> None:
    fake_model.script(
        tool_call("noop", headers={"X-Policy-Version": "4"}),
        tool_call("noop", headers={"X-Policy-Version": "5"}),
        tool_call("noop"),
    )
    body = react(fake_model, 3)
    body["policy"]["config"]["policy_version"] = 4
    answer = post_rollout(client, body)
    seen = [(meta["policy_version"], meta["policy_version_source"]) for meta in metas(answer)]
    assert seen == [(4, "header"), (5, "header"), (4, "config")]
    assert answer["metrics"]["details"]["policy_versions"] == [4, 5]

    named = react(fake_model, 2)
    named["policy"]["config"]["model"] = "crafter-lora-v12"  # the fake model serves the name it is asked for
    versions = [(meta["policy_version"], meta["policy_version_source"]) for meta in metas(post_rollout(client, named))]
    assert versions == [(12, "model_name"), (12, "model_name")]


@pytest.mark.e2e
def test_a_rollout_whose_versions_drift_past_the_lag_stops_with_what_it_has(
    client: httpx.Client, fake_model: FakeModel
) -> None:
    fake_model.script(*(tool_call("move_left", headers={"X-Policy-Version": str(v)}) for v in (1, 2, 4, 4)))
    body = react(fake_model, 4)
    body["policy"]["config"]["max_version_lag"] = 2
    answer = post_rollout(client, body)
    details = answer["metrics"]["details"]
    assert details["stop_reason"] == "version_lag" and answer["aborted"]
    assert len(answer["trajectories"][0]["steps"]) == 2  # the third decision (version 4) was not played
    assert details["policy_versions"] == [1, 2]
    assert details["error"]["class"] == "version_lag" and details["error"]["retryable"]
    assert "max_version_lag (2)" in details["error"]["message"]
    assert excluded(answer) == (True, "infra")


@pytest.mark.e2e
def test_a_bad_version_setting_is_a_422(client: httpx.Client, fake_model: FakeModel) -> None:
    for key, value in (("max_version_lag", -1), ("policy_version", "three")):
        body = react(fake_model, 1)
        body["policy"]["config"][key] = value
        error_body(client.post("/rollout", json=body), 422, "invalid_policy_config")


# --- pauses and aborts ------------------------------------------------------------------------------


@pytest.mark.e2e
def test_answers_a_paused_server_aborted_are_sent_again_and_counted(
    client: httpx.Client, fake_model: FakeModel
) -> None:
    fake_model.script(aborted(), aborted(), tool_call("move_right"), tool_call("noop"))
    answer = post_rollout(client, react(fake_model, 2))
    assert [meta["aborted_answers"] for meta in metas(answer)] == [2, 0]
    assert [meta["actions"] for meta in metas(answer)] == [["move_right"], ["noop"]]
    assert answer["metrics"]["details"]["stop_reason"] == "completed"
    assert len(fake_model.requests) == 4


@pytest.mark.e2e
def test_a_server_that_keeps_aborting_fails_the_rollout_as_infrastructure(
    make_app_server: Callable[..., AppServer], fake_model: FakeModel
) -> None:
    client = make_app_server(inference_abort_retries=1).client()
    fake_model.script(aborted(), aborted())
    answer = post_rollout(client, react(fake_model, 2))
    details = answer["metrics"]["details"]
    assert details["stop_reason"] == "policy_error" and details["error"]["code"] == "inference_aborted"
    assert details["error"]["class"] == "model_unreachable" and details["error"]["retryable"]
    assert excluded(answer) == (True, "infra")
    assert len(fake_model.requests) == 2


@pytest.mark.e2e
def test_a_request_held_through_a_weight_update_is_answered_when_it_resumes(
    client: httpx.Client, fake_model: FakeModel
) -> None:
    resumed = threading.Event()
    fake_model.script(gated(resumed, tool_call("do", headers={"X-Policy-Version": "2"})))
    timer = threading.Timer(0.5, resumed.set)  # the "weight update" holds the request for half a second
    timer.start()
    try:
        answer = post_rollout(client, react(fake_model, 1))
    finally:
        timer.cancel()
    (meta,) = metas(answer)
    assert meta["inference_ms"] >= 450 and meta["attempts"] == 1 and meta["policy_version"] == 2


@pytest.mark.e2e
def test_a_hold_longer_than_the_read_timeout_is_cut_and_sent_again(
    make_app_server: Callable[..., AppServer], fake_model: FakeModel
) -> None:
    client = make_app_server(inference_read_timeout_s=0.3).client()
    fake_model.script(delay(2.0), tool_call("do"))
    (meta,) = metas(post_rollout(client, react(fake_model, 1)))
    assert meta["attempts"] == 2 and meta["actions"] == ["do"]


# --- exclusion -------------------------------------------------------------------------------------


def test_every_error_class_says_whether_to_exclude_the_sample() -> None:
    expected = {
        "model_unreachable": (True, "infra"),
        "model_timeout": (True, "infra"),
        "model_refused": (True, "infra"),
        "model_unusable": (False, "policy"),
        "deadline": (True, "infra"),
        "aborted": (True, "infra"),
        "storage": (False, "infra"),
        "version_lag": (True, "infra"),
        "internal": (True, "infra"),
    }
    assert set(expected) == set(ERROR_CLASSES)
    for name in ERROR_CLASSES:
        assert exclusion(failure(ErrorClass(name), "x", False)) == expected[name], name
    assert exclusion(None) == (False, None)


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("script", "stop_reason", "flags"),
    [
        ([tool_call("noop")], "completed", (False, None)),
        ([text("I am thinking.")] * 3, "policy_unusable", (False, "policy")),
        ([error(400)], "policy_error", (True, "infra")),
    ],
)
def test_the_response_says_whether_to_exclude_it(
    client: httpx.Client, fake_model: FakeModel, script: list[Any], stop_reason: str, flags: tuple[bool, str | None]
) -> None:
    fake_model.script(*script)
    answer = post_rollout(client, react(fake_model, 3 if len(script) == 3 else 1))
    assert answer["metrics"]["details"]["stop_reason"] == stop_reason
    assert excluded(answer) == flags


# --- continuation ----------------------------------------------------------------------------------


def test_continue_from_names_exactly_one_state_and_no_seed() -> None:
    bad = [
        {"env_name": "crafter", "continue_from": {}},
        {"env_name": "crafter", "continue_from": {"env_id": "a", "snapshot_id": "b"}},
        {"env_name": "crafter", "seed": 3, "continue_from": {"snapshot_id": "b"}},
        {"env_name": "crafter", "task_id": "crafter/train/1", "continue_from": {"snapshot_id": "b"}},
    ]
    for env in bad:
        body = request_body()
        body["env"] = env
        with pytest.raises(InvalidRequest) as caught:
            build_plan(RolloutRequest.model_validate(body), Settings())
        assert caught.value.code == "invalid_continue_from"


def _answers(decisions: int) -> list[Any]:
    """One model answer per decision, built once so that two rollouts get the very same answers."""
    moves = ["move_left", "move_right", "move_up", "move_down", "do", "noop"]
    return [tool_call(moves[index % len(moves)], "do") for index in range(decisions)]


def _played(answer: dict[str, Any]) -> list[tuple[Any, ...]]:
    """What two rollouts must share to be the same trajectory: observations, calls, rewards, ends, tokens."""
    return [
        (
            step["obs"]["text"],
            step["tool_calls"],
            step["reward"],
            step["done"],
            step["info"]["achievements_added"],
            step["info"]["meta"]["actions"],
            step["info"].get("tokens"),
            step.get("logprob"),
        )
        for step in answer["trajectories"][0]["steps"]
    ]


@pytest.mark.e2e
def test_a_rollout_split_at_a_snapshot_plays_and_asks_exactly_as_one_rollout(
    client: httpx.Client, fake_model: FakeModel
) -> None:
    fake_model.tokens = "vllm"
    answers, total, split = _answers(8), 8, 3
    env = {"seed": 11, "config": ROOMY}

    fake_model.script(*answers)
    whole = post_rollout(client, react(fake_model, total, env=env, record={"logprobs": True}))
    asked_whole = [record.body["messages"] for record in fake_model.requests]
    fake_model.reset()
    fake_model.tokens = "vllm"

    fake_model.script(*answers)
    first = post_rollout(client, react(fake_model, split, env=env, record={"logprobs": True, "snapshot": True}))
    snapshot_id = first["trajectories"][0]["final"]["snapshot_id"]
    assert isinstance(snapshot_id, str)
    second_body = react(fake_model, total - split, record={"logprobs": True})
    second_body["env"] = {"env_name": "crafter", "config": ROOMY, "continue_from": {"snapshot_id": snapshot_id}}
    second = post_rollout(client, second_body)
    asked_split = [record.body["messages"] for record in fake_model.requests]

    assert asked_split == asked_whole  # the same prompts, history lines and their numbers included
    assert _played(first) + _played(second) == _played(whole)
    assert all(step[6]["prompt_token_ids"] for step in _played(second))
    assert second["pipeline_metadata"]["seed"] == 11  # the continued world keeps its seed for resets
    assert whole["trajectories"][0]["final"] == {"observation": second["trajectories"][0]["final"]["observation"]}


@pytest.mark.e2e
def test_a_group_from_one_snapshot_explores_branches(client: httpx.Client, fake_model: FakeModel) -> None:
    fake_model.script(*_answers(4))
    trunk = post_rollout(client, react(fake_model, 4, env={"seed": 5, "config": ROOMY}, record={"snapshot": True}))
    snapshot_id = trunk["trajectories"][0]["final"]["snapshot_id"]
    branch_moves = ["move_left", "move_right", "move_up"]

    def answer(record: Recorded) -> Any:
        return tool_call(branch_moves[int(record.query.rpartition("branch=")[2])], "do")

    fake_model.responder = answer
    group = []
    for index in range(len(branch_moves)):
        body = react(fake_model, 3)
        body["policy"]["config"]["inference_url"] = fake_model.url() + f"?branch={index}"
        body["env"] = {"env_name": "crafter", "config": ROOMY, "continue_from": {"snapshot_id": snapshot_id}}
        group.append(body)
    accepted = client.post("/rollouts", json=group)
    assert accepted.status_code == 202, accepted.text
    results: dict[str, dict[str, Any]] = {}

    def done() -> bool:
        for body in group:
            response = client.get(f"/runs/{body['run_id']}/result")
            if response.status_code == 200:
                results[body["run_id"]] = response.json()
        return len(results) == len(group)

    wait_until(done, timeout=30.0)
    branches = [results[body["run_id"]]["trajectories"][0]["steps"] for body in group]
    start = trunk["trajectories"][0]["final"]["observation"]["text"]
    assert all(steps[0]["obs"]["text"] == start for steps in branches)  # every branch starts at the snapshot
    assert len({steps[-1]["obs"]["text"] for steps in branches}) == len(branch_moves)  # and they diverge
    assert [steps[0]["info"]["meta"]["actions"][0] for steps in branches] == branch_moves


@pytest.mark.e2e
def test_a_rollout_continues_from_an_env_session_and_leaves_it_as_it_was(
    client: httpx.Client, fake_model: FakeModel
) -> None:
    created = client.post("/create", json={"env_name": "crafter", "seed": 9, "config": {}})
    env_id = created.json()["env_id"]
    for actions in (["move_left", "move_left"], ["do"], ["move_up"]):
        calls = [{"tool": "interact_many", "args": {"actions": actions}}]
        assert client.post("/step", json={"env_id": env_id, "tool_calls": calls}).status_code == 200
    snapshot_id = client.post("/snapshot", json={"env_id": env_id}).json()["snapshot_id"]

    def continued(start: dict[str, str]) -> list[tuple[Any, ...]]:
        fake_model.script(*_answers(2))
        body = react(fake_model, 2)
        body["env"] = {"env_name": "crafter", "config": ROOMY, "continue_from": start}
        return _played(post_rollout(client, body))

    from_env = continued({"env_id": env_id})
    assert from_env == continued({"snapshot_id": snapshot_id})  # the env's current state is the same start
    later = client.post("/snapshot", json={"env_id": env_id}).json()["snapshot_id"]
    assert continued({"snapshot_id": later}) == from_env  # and the rollout left the env as it was


@pytest.mark.e2e
def test_a_missing_start_is_a_404(client: httpx.Client, fake_model: FakeModel) -> None:
    for start, code in (({"snapshot_id": "no-such-snapshot"}, "snapshot_not_found"), ({"env_id": "nope"}, None)):
        body = react(fake_model, 1)
        body["env"] = {"env_name": "crafter", "continue_from": start}
        error_body(client.post("/rollout", json=body), 404, code)
