"""End to end over real HTTP: `/`, health, auth on every route, `/info`, `/task_info`, `/done`, the route table.

Every client here comes from `AppServer.client()`, which fails the test if any response body or header
contains a 4-character piece of a configured key; `no_key_in_logs` does the same for log records.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
from conftest import ALIAS_KEY, TEST_KEY, AppServer
from fastapi import FastAPI
from helpers import SAMPLES, error_body

from task_app.game import ACTIONS

pytestmark = pytest.mark.usefixtures("no_key_in_logs")

# Routes anyone may call. FastAPI's docs routes are public when enabled: the schema is the public
# contract and carries no secret (see the report on whether to keep them enabled in production).
PUBLIC_PATHS = frozenset(
    {"/", "/health", "/health/rollout", "/docs", "/docs/oauth2-redirect", "/openapi.json", "/redoc"}
)
CONTRACT_ROUTES = {
    ("GET", "/"),
    ("HEAD", "/"),
    ("GET", "/health"),
    ("GET", "/health/rollout"),
    ("GET", "/info"),
    ("GET", "/task_info"),
    ("POST", "/rollout"),
    ("POST", "/done"),
    ("GET", "/run/status/{run_id}"),
    ("POST", "/run/abort"),
    ("POST", "/rollouts"),
    ("GET", "/runs/{run_id}"),
    ("GET", "/runs/{run_id}/result"),
    ("GET", "/metrics"),
    ("POST", "/proxy/v1/chat/completions"),
    ("POST", "/proxy/groq/v1/chat/completions"),
}
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def _sample(name: str) -> Any:
    return json.loads((SAMPLES / name).read_text())


def route_table(app: FastAPI) -> list[tuple[str, str]]:
    """Every (method, path) the app serves, included routers flattened."""
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:  # FastAPI before included-router contexts: app.routes is already flat
        routes: Any = app.routes
    else:
        routes = iter_route_contexts(app.routes)
    pairs = []
    for route in routes:
        methods, path = getattr(route, "methods", None), getattr(route, "path", None)
        if methods and path is not None:
            pairs.extend((method, path) for method in sorted(methods))
    return pairs


@pytest.fixture(scope="module")
def anonymous(app_server: AppServer) -> httpx.Client:
    return app_server.client(key=None)


# --- / and health ---------------------------------------------------------------------------------


def test_root_get_and_head(app_server: AppServer, anonymous: httpx.Client) -> None:
    response = anonymous.get("/")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "service": app_server.settings.service_id}
    assert set(response.json()) == set(_sample("root.shape.json")["body"])
    head = anonymous.head("/")
    assert head.status_code == 200
    assert head.content == b""


@pytest.mark.parametrize("path", ["/health", "/health/rollout"])
def test_health_is_public_and_ready_with_a_key(anonymous: httpx.Client, path: str) -> None:
    response = anonymous.get(path)
    assert response.status_code == 200
    body = response.json()
    assert body["healthy"] is True
    assert body["auth"] == {"required": True, "configured": True}
    assert body["rollouts"]["active"] == 0


@pytest.mark.parametrize("key", [None, ""], ids=["unset", "empty"])
def test_no_key_configured_means_not_ready_and_503(make_app_server: Any, key: str | None) -> None:
    server = make_app_server(environment_api_key=key, environment_api_key_aliases=[])
    anonymous, keyed = server.client(key=None), server.client()
    for path in ("/health", "/health/rollout"):
        response = anonymous.get(path)
        assert response.status_code == 503
        body = response.json()
        assert body["healthy"] is False
        assert body["auth"] == {"required": True, "configured": False}
    assert anonymous.get("/").status_code == 200
    for client in (anonymous, keyed):
        error_body(client.get("/info"), 503, "missing_environment_api_key")
        error_body(client.post("/rollout", json={}), 503, "missing_environment_api_key")
        error_body(client.get("/run/status/anything"), 503, "missing_environment_api_key")


# --- auth -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {"X-API-Key": TEST_KEY},
        {"X-API-Key": ALIAS_KEY},
        {"X-API-Keys": f"not-a-key, {TEST_KEY}"},
        {"X-API-Keys": f"{ALIAS_KEY},not-a-key"},
        {"Authorization": f"Bearer {TEST_KEY}"},
        {"Authorization": f"bearer {ALIAS_KEY}"},
        {"X-API-Key": "not-a-key", "Authorization": f"Bearer {TEST_KEY}"},
    ],
    ids=["x-api-key", "alias", "x-api-keys-second", "x-api-keys-alias-first", "bearer", "bearer-alias", "one-of-two"],
)
def test_accepted_ways_to_present_a_key(app_server: AppServer, headers: dict[str, str]) -> None:
    client = app_server.client(key=None, headers=headers)
    assert client.get("/info").status_code == 200
    assert client.post("/done").status_code == 200
    error_body(client.get("/run/status/never-ran"), 404, "run_not_found")  # past auth


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"X-API-Key": "not-a-key"},
        {"X-API-Key": TEST_KEY[:-1]},
        {"X-API-Key": TEST_KEY + "x"},
        {"X-API-Key": TEST_KEY.upper()},
        {"X-API-Keys": "not-a-key, also-not"},
        {"Authorization": f"Basic {TEST_KEY}"},
        {"Authorization": "Bearer"},
        {"Authorization": TEST_KEY},
    ],
    ids=["none", "wrong", "prefix", "longer", "case", "keys-list", "basic-scheme", "empty-bearer", "no-scheme"],
)
def test_rejected_keys_get_401(app_server: AppServer, headers: dict[str, str]) -> None:
    client = app_server.client(key=None, headers=headers)
    error_body(client.get("/info"), 401, "unauthorized")
    error_body(client.post("/rollout", json={"run_id": "x"}), 401, "unauthorized")
    error_body(
        client.post("/rollout", content=b"{not json", headers={"Content-Type": "application/json"}), 401, "unauthorized"
    )


def test_route_table_has_unique_pairs_and_the_contract_routes(app_server: AppServer) -> None:
    pairs = route_table(app_server.app)
    duplicates = sorted({pair for pair in pairs if pairs.count(pair) > 1})
    assert not duplicates, f"Starlette would silently shadow: {duplicates}"
    missing = CONTRACT_ROUTES - set(pairs)
    assert not missing


def test_every_route_outside_the_public_list_requires_a_key(app_server: AppServer, anonymous: httpx.Client) -> None:
    wrong = app_server.client(key="not-a-key")
    checked = 0
    for method, path in route_table(app_server.app):
        url = re.sub(r"\{[^}]+\}", "some-id", path)
        kwargs: dict[str, Any] = {"json": {}} if method in BODY_METHODS else {}
        if path in PUBLIC_PATHS:
            assert anonymous.request(method, url, **kwargs).status_code == 200, (method, path)
            continue
        for client in (anonymous, wrong):
            error_body(client.request(method, url, **kwargs), 401, "unauthorized")
        checked += 1
    assert checked >= len({pair for pair in CONTRACT_ROUTES if pair[1] not in PUBLIC_PATHS})


def test_openapi_schema_is_served(anonymous: httpx.Client) -> None:
    """Duplicate operation ids (GET+HEAD on one route) made this a 500 under warnings-as-errors."""
    response = anonymous.get("/openapi.json")
    if response.status_code == 404:
        pytest.skip("the app does not serve /openapi.json")
    assert response.status_code == 200
    assert "/rollout" in response.json()["paths"]


# --- /info, /task_info, /done ---------------------------------------------------------------------


def test_info(client: httpx.Client) -> None:
    response = client.get("/info")
    assert response.status_code == 200
    body = response.json()
    shape = _sample("info.shape.json")
    assert set(body) == set(shape)
    assert set(body["service"]) >= set(shape["service"])
    assert body["inference"]["tool"] == {"name": "interact_many", "parallel_tool_calls": False}
    assert body["inference"]["endpoints"] == {
        "openai": "/proxy/v1/chat/completions",
        "groq": "/proxy/groq/v1/chat/completions",
    }
    assert set(body["inference"]) >= set(shape["inference"])
    for kind, count in (("outcome", 5), ("events", 4)):
        rubric = body["rubrics"][kind]
        assert set(rubric) >= {"version", "goal_text", "criteria", "aggregation"}
        assert len(rubric["criteria"]) == count
        for criterion in rubric["criteria"]:
            assert set(criterion) == {"id", "description", "weight", "required"}
            assert criterion["id"] and criterion["description"] and criterion["weight"] > 0
    limits = body["limits"]
    assert limits["max_ops"] > 0 and limits["max_time_s"] > 0
    assert limits["max_concurrent_rollouts"] > 0


def test_task_info_without_seeds_describes_the_taskset(client: httpx.Client) -> None:
    response = client.get("/task_info")
    assert response.status_code == 200
    body = response.json()
    shape = _sample("task_info_no_seed.shape.json")["body"]
    assert set(body) == set(shape) == {"taskset"}
    assert set(body["taskset"]) == set(shape["taskset"]) | {"task_id_format", "task_splits"}  # + splits (docs/tasks.md)
    assert body["taskset"]["config"] == {"area": [64, 64], "length": 10_000}


def _check_task_info(info: dict[str, Any], seed: int) -> None:
    shape = _sample("task_info_seed1.shape.json")
    assert set(info) == set(shape) | {"task_id"}  # + the task the seed is (docs/tasks.md)
    for key in ("dataset", "rubric", "inference", "limits", "action_space", "observation"):
        assert set(info[key]) >= set(shape[key]), key
    assert info["dataset"]["seed"] == info["dataset"]["config"]["seed"] == info["observation"]["seed"] == seed
    assert info["action_space"]["actions"] == list(ACTIONS)
    assert info["action_space"]["size"] == 17
    assert set(info["observation"]["traits"]) >= {"trees", "cows", "hostiles"}
    assert set(info["observation"]["inventory"]) == set(shape["observation"]["inventory"])


def test_task_info_for_one_seed_is_an_object(client: httpx.Client) -> None:
    response = client.get("/task_info", params={"seed": 1})
    assert response.status_code == 200
    _check_task_info(response.json(), 1)


@pytest.mark.parametrize("params", [{"seed": [1, 2]}, {"seeds": [1, 2]}, {"seed": 1, "seeds": 2}])
def test_task_info_for_several_seeds_is_a_list(client: httpx.Client, params: dict[str, Any]) -> None:
    response = client.get("/task_info", params=params)
    assert response.status_code == 200
    body = response.json()
    assert isinstance(body, list) and len(body) == 2
    for info, seed in zip(body, (1, 2), strict=True):
        _check_task_info(info, seed)
    assert body[0] == client.get("/task_info", params={"seed": 1}).json()


def test_task_info_traits_count_trees(client: httpx.Client) -> None:
    """The seed system reported 0 trees for every seed; the real worlds have plenty."""
    seeds = list(range(10))
    body = client.get("/task_info", params={"seed": seeds}).json()
    trees = [info["observation"]["traits"]["trees"] for info in body]
    assert sum(count > 0 for count in trees) >= 8, trees
    assert len({tuple(sorted(info["observation"]["traits"].items())) for info in body}) > 1


def test_task_info_rejects_too_many_seeds(client: httpx.Client) -> None:
    body = error_body(client.get("/task_info", params={"seed": list(range(257))}), 422, "too_many_seeds")
    assert "256" in body["error"]["message"]
    assert client.get("/task_info", params={"seed": list(range(256))[:1]}).status_code == 200


@pytest.mark.parametrize("value", ["abc", "1.5", ""])
def test_task_info_rejects_non_integer_seeds(client: httpx.Client, value: str) -> None:
    error_body(client.get("/task_info", params={"seed": value}), 422, "invalid_request")


@pytest.mark.parametrize("value", [-1, 2**31, 10**30])
def test_task_info_rejects_seeds_out_of_range(client: httpx.Client, value: int) -> None:
    response = client.get("/task_info", params={"seed": [1, value]})
    assert response.status_code == 422
    assert response.json()["error"]["code"] in {"seed_out_of_range", "invalid_request"}
    if abs(value) < 2**63:
        error_body(response, 422, "seed_out_of_range")


def test_done(app_server: AppServer, client: httpx.Client) -> None:
    response = client.post("/done")
    assert response.status_code == 200
    assert response.json() == {"ok": True, "service": app_server.settings.service_id}
