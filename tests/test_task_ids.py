"""Tasks, splits and task ids: the grammar, the two disjoint splits, and a task id accepted wherever a seed
is (create, reset, the classic initialize, /rollout, POST /rollouts, /task_info), with a precise 422 for a
malformed, unknown or disagreeing one."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from conftest import AppServer
from conftest import expect_error as error
from helpers import make_plan, request_body

from task_app.core.errors import InvalidRequest
from task_app.core.settings import MAX_SEED, Settings
from task_app.core.tasks import EVAL_FIRST_SEED, EVAL_SIZE, Tasks
from task_app.sessions import build_spec


def test_the_splits_are_disjoint_and_cover_the_seed_range() -> None:
    tasks = Tasks(Settings())
    train, held_out = tasks.splits["train"], tasks.splits["eval"]
    assert (train.first_seed, train.size) == (0, EVAL_FIRST_SEED)
    assert (held_out.first_seed, held_out.size) == (EVAL_FIRST_SEED, EVAL_SIZE)
    assert held_out.seed(EVAL_SIZE - 1) == MAX_SEED
    assert tasks.parse("crafter/train/17").seed == 17
    assert tasks.parse("Crafter/eval/0").seed == EVAL_FIRST_SEED
    for seed in (0, 17, EVAL_FIRST_SEED - 1, EVAL_FIRST_SEED, MAX_SEED):
        task = tasks.task_of_seed(seed)
        assert tasks.parse(task.task_id) == task and task.seed == seed
    assert tasks.task_of_seed(EVAL_FIRST_SEED + 3).task_id == "crafter/eval/3"
    small = Tasks(Settings(max_seed=999))  # a smaller seed range shrinks train; eval stays the same set
    assert small.splits["train"].size == 1000 and small.parse("crafter/eval/3").seed == EVAL_FIRST_SEED + 3
    assert tasks.random_train_seed() < EVAL_FIRST_SEED


@pytest.mark.parametrize(
    ("task_id", "code"),
    [
        ("crafter/eval/017", "invalid_task_id"),
        ("crafter/eval/-1", "invalid_task_id"),
        ("crafter/eval", "invalid_task_id"),
        ("crafter/eval/1/2", "invalid_task_id"),
        ("", "invalid_task_id"),
        ("crafter/ eval/1", "invalid_task_id"),
        ("crafter/eval/" + "9" * 11, "invalid_task_id"),
        ("math/train/1", "unknown_env"),
        ("crafter/test/1", "unknown_split"),
        ("crafter/eval/256", "task_index_out_of_range"),
        (f"crafter/train/{EVAL_FIRST_SEED}", "task_index_out_of_range"),
    ],
)
def test_bad_task_ids_get_a_precise_code(task_id: str, code: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        Tasks(Settings()).parse(task_id)
    assert raised.value.code == code and raised.value.status == 422


def test_a_task_id_is_accepted_wherever_a_seed_is_in_plans_and_specs() -> None:
    settings = Settings()
    assert make_plan(env={"seed": None, "task_id": "crafter/eval/5"}).seed == EVAL_FIRST_SEED + 5
    assert make_plan(env={"seed": 9, "task_id": "crafter/train/9"}).seed == 9
    with pytest.raises(InvalidRequest, match="disagree") as raised:
        make_plan(env={"seed": 8, "task_id": "crafter/train/9"})
    assert raised.value.code == "task_seed_mismatch"
    with pytest.raises(InvalidRequest) as raised:
        make_plan(env={"seed": None, "task_id": "crafter/eval/5", "config": {"area": [32, 32]}})
    assert raised.value.code == "task_config_mismatch"
    assert build_spec("crafter", {}, None, None, settings, "crafter/eval/1").seed == EVAL_FIRST_SEED + 1
    assert build_spec("crafter", {"length": 50}, None, None, settings, "crafter/eval/1").length == 50
    assert build_spec("crafter", {}, None, None, settings).seed < EVAL_FIRST_SEED  # a random train world


@pytest.mark.e2e
def test_task_ids_over_http(client: httpx.Client) -> None:
    described = client.get("/task_info").json()["taskset"]
    assert described["splits"] == ["train", "eval"] and described["task_id_format"] == "crafter/{split}/{index}"
    assert [split["name"] for split in described["task_splits"]] == ["train", "eval"]
    assert described["task_splits"][1]["seeds"] == [EVAL_FIRST_SEED, MAX_SEED]
    one = client.get("/task_info", params={"task_id": "crafter/eval/2"}).json()
    assert (one["task_id"], one["dataset"]["seed"], one["dataset"]["split"]) == (
        "crafter/eval/2",
        EVAL_FIRST_SEED + 2,
        "eval",
    )
    both = client.get("/task_info", params={"seed": 4, "task_id": "crafter/train/5"}).json()
    assert [info["task_id"] for info in both] == ["crafter/train/4", "crafter/train/5"]
    error(client.get("/task_info", params={"task_id": "crafter/dev/1"}), 422, "unknown_split")
    error(client.get("/task_info", params={"task_id": "x" * 65}), 422, "invalid_request")

    created = client.post("/create", json={"env_name": "crafter", "task_id": "crafter/eval/7"}).json()
    assert (created["info"]["seed"], created["info"]["task_id"]) == (EVAL_FIRST_SEED + 7, "crafter/eval/7")
    env_id = created["env_id"]
    reset = client.post("/reset", json={"env_id": env_id, "task_id": "crafter/train/3"}).json()
    assert (reset["info"]["seed"], reset["info"]["task_id"]) == (3, "crafter/train/3")
    error(
        client.post("/reset", json={"env_id": env_id, "seed": 2, "task_id": "crafter/train/3"}),
        422,
        "task_seed_mismatch",
    )
    error(client.post("/create", json={"env_name": "crafter", "task_id": "crafter/eval/x"}), 422, "invalid_task_id")
    small = client.post("/create", json={"env_name": "crafter", "seed": 1, "config": {"area": [32, 32]}}).json()
    assert small["info"]["task_id"] is None  # another area: a world that is no task
    bad_area = {"env_id": small["env_id"], "task_id": "crafter/train/1"}
    error(client.post("/reset", json=bad_area), 422, "task_config_mismatch")
    classic = client.post("/CrafterClassic/initialize", json={"task_id": "crafter/eval/0"}).json()
    assert classic["info"]["seed"] == EVAL_FIRST_SEED
    error(client.post("/CrafterClassic/initialize", json={"task_id": 3}), 422, "invalid_task_id")


@pytest.mark.e2e
def test_a_rollout_and_a_submitted_run_start_from_a_task_id(app_server: AppServer) -> None:
    client = app_server.client()
    body: dict[str, Any] = request_body(decisions=2, env={"seed": None, "task_id": "crafter/eval/9"})
    answer = client.post("/rollout", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["pipeline_metadata"]["seed"] == EVAL_FIRST_SEED + 9
    bad = request_body(decisions=2, env={"seed": 1, "task_id": "crafter/eval/9"})
    error(client.post("/rollout", json=bad), 422, "task_seed_mismatch")
    error(client.post("/rollouts", json=[bad]), 422, "task_seed_mismatch")
