"""The env-session routes on a real server: the seed's paths and shapes, every success and error, caps
and expiry, auth on every route, restore fidelity and branch independence over HTTP."""

from __future__ import annotations

import json
import random
import time
from typing import Any

import httpx
import pytest
from support.errors import error_body as error
from support.polling import wait_until
from support.servers import AppServer
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from task_app.game import ACTIONS
from task_app.service.taskset import OBSERVATION_KEYS

pytestmark = [pytest.mark.usefixtures("no_key_in_logs"), pytest.mark.e2e]

SEED_PATHS = ["/create", "/reset", "/step", "/snapshot", "/restore", "/terminate", "/branch"]
CLASSIC = ["/CrafterClassic/initialize", "/CrafterClassic/step", "/CrafterClassic/terminate"]
HOSTED = [f"/env{path}" for path in SEED_PATHS if path != "/branch"] + [f"/env{path}" for path in CLASSIC]
NAMED = [
    f"/env/{name}/{action}" for name in ("crafter", "CrafterClassic") for action in ("initialize", "step", "terminate")
]


def interact(*actions: str | int) -> list[dict[str, Any]]:
    return [{"tool": "interact_many", "args": {"actions": list(actions)}}]


def create(client: httpx.Client, seed: int = 5, **config: Any) -> dict[str, Any]:
    response = client.post("/create", json={"env_name": "crafter", "seed": seed, "config": config, "rl_run_id": "r"})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def step(client: httpx.Client, env_id: str, tool_calls: list[Any], path: str = "/step") -> dict[str, Any]:
    response = client.post(path, json={"env_id": env_id, "tool_calls": tool_calls})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


# --- shapes ---------------------------------------------------------------------------------------------


def test_create_reset_step_have_the_seed_shapes(client: httpx.Client) -> None:
    created = create(client)
    assert set(created) == {"env_id", "observation", "info", "step_idx"}
    assert set(OBSERVATION_KEYS) <= set(created["observation"])  # what /info advertises
    assert "observation_image_base64" not in created["observation"]  # the frame only when asked
    assert created["step_idx"] == 0 and created["info"]["seed"] == 5
    assert created["observation"]["text"].startswith("Step 0/10000")
    stepped = step(client, created["env_id"], interact("move_left", "do", "jump"))
    assert set(stepped) == {"observation", "done", "info", "reward", "truncated", "step_idx"}
    assert stepped["step_idx"] == 2 and stepped["done"] is False and stepped["truncated"] is False
    assert stepped["info"]["actions"] == ["move_left", "do"]
    assert stepped["info"]["rejected"] == [{"item": "jump", "reason": "unknown action"}]
    assert isinstance(stepped["reward"], float)
    reset = client.post("/reset", json={"env_id": created["env_id"], "seed": 6}).json()
    assert set(reset) == {"observation", "info", "step_idx"}
    assert (reset["step_idx"], reset["info"]["seed"], reset["info"]["episode"]) == (0, 6, 2)
    again = client.post("/reset", json={"env_id": created["env_id"]}).json()  # no seed: the current one
    assert (again["info"]["seed"], again["observation"]["text"]) == (6, reset["observation"]["text"])


def test_a_null_seed_draws_a_world_and_says_which(client: httpx.Client) -> None:
    seeds = {
        client.post("/create", json={"env_name": "crafter", "rl_run_id": "r"}).json()["info"]["seed"] for _ in range(3)
    }
    assert len(seeds) == 3  # not world 0 every time, as in the seed


def test_every_tool_call_shape_steps_the_env(client: httpx.Client) -> None:
    env_id = create(client)["env_id"]
    shapes = [
        [{"type": "function", "function": {"name": "interact_many", "arguments": '{"actions": ["noop", "noop"]}'}}],
        [{"tool_name": "interact_many", "arguments": {"actions": ["noop", 0]}}],
        [{"tool": "interact", "args": {"action": "noop"}}, {"name": "noop"}],
        [{"function_call": {"name": "interact", "arguments": {"actions": [0, "NOOP"]}}}],
    ]
    for tool_calls in shapes:
        assert step(client, env_id, tool_calls)["info"]["actions"] == ["noop", "noop"], tool_calls
    nothing = step(client, env_id, [{"tool": "dance"}])
    assert nothing["info"]["noop_fallback"] is True and nothing["info"]["actions"] == ["noop"]
    too_many = step(client, env_id, interact(*["noop"] * 10))
    assert len(too_many["info"]["actions"]) == 8 and len(too_many["info"]["rejected"]) == 2


def test_a_frame_when_the_env_asks_for_one(client: httpx.Client) -> None:
    observation = create(client, image_size=32)["observation"]
    assert observation["observation_image_width"] == 32
    assert observation["observation_image_data_url"].startswith("data:image/png;base64,")


def test_classic_hosted_and_named_paths(client: httpx.Client) -> None:
    for prefix in ("", "/env"):
        created = client.post(f"{prefix}/CrafterClassic/initialize", json={"seed": 4, "world_config": "easy"}).json()
        assert created["info"]["seed"] == 4
        by_actions = client.post(
            f"{prefix}/CrafterClassic/step", json={"env_id": created["env_id"], "action": {"actions": ["noop", 5]}}
        ).json()
        assert by_actions["info"]["actions"] == ["noop", "do"]
        by_calls = client.post(
            f"{prefix}/CrafterClassic/step",
            json={"env_id": created["env_id"], "action": {"tool_calls": interact("noop")}},
        ).json()
        assert by_calls["step_idx"] == 3
        assert client.post(f"{prefix}/CrafterClassic/terminate", json={"env_id": created["env_id"]}).json() == {
            "ok": True
        }
    hosted = client.post("/env/create", json={"env_name": "CrafterClassic", "seed": 2}).json()
    assert step(client, hosted["env_id"], interact("noop"), path="/env/step")["step_idx"] == 1
    assert client.post("/env/snapshot", json={"env_id": hosted["env_id"]}).status_code == 200
    for name in ("crafter", "CrafterClassic"):
        named = client.post(f"/env/{name}/initialize", json={"seed": 9, "config": {"difficulty": "hard"}}).json()
        moved = client.post(f"/env/{name}/step", json={"env_id": named["env_id"], "action": {"actions": ["noop"]}})
        assert moved.json()["step_idx"] == 1
        assert client.post(f"/env/{name}/terminate", json={"env_id": named["env_id"]}).json() == {"ok": True}
    error(client.post("/env/sokoban/initialize", json={}), 422, "unknown_env")


# --- errors -----------------------------------------------------------------------------------------------


def test_client_mistakes_are_precise(client: httpx.Client) -> None:
    env_id = create(client)["env_id"]
    missing = "A" * 22
    error(client.post("/step", json={"env_id": missing, "tool_calls": []}), 404, "env_not_found")
    error(client.post("/reset", json={"env_id": "../../etc"}), 404, "env_not_found")
    error(client.post("/restore", json={"snapshot_id": missing}), 404, "snapshot_not_found")
    error(client.post("/create", json={"env_name": "wordle"}), 422, "unknown_env")
    error(client.post("/create", json={"env_name": "crafter", "seed": -1}), 422, "seed_out_of_range")
    error(client.post("/create", json={"env_name": "crafter", "config": {"area": [4, 4]}}), 422, "invalid_env_config")
    error(client.post("/create", json={"env_name": "crafter", "config": {"length": "long"}}), 422, "invalid_env_config")
    error(client.post("/step", json={"env_id": env_id, "tool_calls": "move_left"}), 422, "invalid_request")
    error(client.post("/step", json={"tool_calls": []}), 422, "invalid_request")
    error(client.post("/reset", json={"env_id": env_id, "seed": 2**40}), 422, "seed_out_of_range")
    error(client.post("/branch", json={"env_ids": [env_id], "num_children": 11}), 422, "too_many_branches")
    error(
        client.post("/branch", json={"env_ids": [env_id], "num_children": 65, "max_branches": 100}),
        422,
        "too_many_children",
    )
    error(client.post("/branch", json={"env_ids": [missing]}), 404, "env_not_found")
    error(client.post("/branch", json={"policy_ids": ["p"]}), 404, "policy_not_found")
    error(client.post("/CrafterClassic/initialize", json={"seed": "one"}), 422, "invalid_request")
    error(client.post("/step", content=b"{nope", headers={"Content-Type": "application/json"}), 400, "invalid_json")
    assert client.post("/terminate", json={"env_id": env_id}).json() == {"ok": True}
    gone = error(client.post("/step", json={"env_id": env_id, "tool_calls": []}), 404, "env_not_found")
    assert "terminated" in gone["error"]["message"]
    assert client.post("/branch", json={}).json() == {"env_branches": {}, "policy_branches": {}}


def test_caps_answer_429_with_retry_after(make_app_server: Any) -> None:
    server: AppServer = make_app_server(sessions_max_envs=2, sessions_max_snapshots=1, sessions_rate_per_s=5)
    client = server.client()
    first = create(client)["env_id"]
    create(client)
    full = error(client.post("/create", json={"env_name": "crafter"}), 429, "too_many_envs")
    assert full["error"]["limit"] == 2
    assert client.post("/create", json={"env_name": "crafter"}).headers["Retry-After"] == "5"
    assert client.post("/snapshot", json={"env_id": first}).status_code == 200
    snapshots = client.post("/snapshot", json={"env_id": first})
    error(snapshots, 429, "too_many_snapshots")
    assert int(snapshots.headers["Retry-After"]) > 3000  # until the first snapshot expires (TTL 1 h)
    error(client.post("/branch", json={"env_ids": [first]}), 429, "too_many_envs")
    limited = [client.post("/step", json={"env_id": first, "tool_calls": []}) for _ in range(8)]
    assert {response.status_code for response in limited} == {200, 429}
    refused = next(response for response in limited if response.status_code == 429)
    error(refused, 429, "env_rate_limited")
    assert refused.headers["Retry-After"] == "1"


def test_the_live_cache_and_the_step_limit(make_app_server: Any) -> None:
    server: AppServer = make_app_server(sessions_max_live=1, sessions_max_steps=3)
    client = server.client()
    first, second = create(client)["env_id"], create(client)["env_id"]
    for _ in range(3):  # the first step rebuilds `first` (creating `second` evicted it), evicting `second`
        step(client, first, interact("noop"))
    assert step(client, second, interact("noop"))["step_idx"] == 1
    error(client.post("/step", json={"env_id": first, "tool_calls": []}), 409, "env_step_limit")
    assert server.state.sessions.envs.counters["rebuilds"] >= 2


def test_idle_envs_expire_with_410(make_app_server: Any) -> None:
    server: AppServer = make_app_server(sessions_ttl_s=1.0, sessions_max_envs=1)
    client = server.client()
    env_id = create(client)["env_id"]
    time.sleep(1.3)  # idle past the TTL (the reaper runs every 0.25 s)
    error(client.post("/step", json={"env_id": env_id, "tool_calls": []}), 410, "env_expired")
    error(client.post("/snapshot", json={"env_id": env_id}), 410, "env_expired")
    create(client)  # its slot was freed


def test_no_env_route_answers_without_the_key(app_server: AppServer) -> None:
    anonymous, wrong = app_server.client(key=None), app_server.client(key="not-the-key")
    for path in [*SEED_PATHS, *CLASSIC, *HOSTED, *NAMED, "/openenv/tokens", "/openenv/tokens/revoke"]:
        for who in (anonymous, wrong):
            error(who.post(path, json={"env_name": "crafter", "env_id": "x"}), 401, "unauthorized")
            error(who.post(path, content=b"{bad", headers={"Content-Type": "application/json"}), 401, "unauthorized")


# --- fidelity and independence ---------------------------------------------------------------------------


def random_calls(rng: random.Random, count: int) -> list[list[dict[str, Any]]]:
    return [interact(*(rng.choice(ACTIONS) for _ in range(rng.randint(1, 3)))) for _ in range(count)]


def play(client: httpx.Client, env_id: str, calls: list[list[dict[str, Any]]]) -> tuple[list[Any], dict[str, bool]]:
    """Step through `calls`, resetting after each episode; what was seen (the last item: where it stands)."""
    seen: list[Any] = []
    events = {"death": False, "night": False}
    for tool_calls in calls:
        answer = step(client, env_id, tool_calls)
        events["night"] |= ", night" in answer["observation"]["text"].splitlines()[0]
        events["death"] |= answer["info"]["terminated"]
        seen.append(
            (answer["observation"], answer["reward"], answer["done"], answer["step_idx"], answer["info"]["actions"])
        )
        if answer["done"]:
            seen.append((client.post("/reset", json={"env_id": env_id}).json()["observation"],))
    return seen, events


def test_a_restored_env_continues_exactly_as_the_original(client: httpx.Client) -> None:
    rng = random.Random(7)
    original = create(client, seed=7)["env_id"]
    before, events = play(client, original, random_calls(rng, 200))
    assert events == {"death": True, "night": True}  # the 200 decisions included a death and a night
    snapshot = client.post("/snapshot", json={"env_id": original}).json()
    assert set(snapshot) == {"snapshot_id", "path", "rl_run_id", "size"} and snapshot["rl_run_id"] == "r"
    restored = client.post("/restore", json={"snapshot_id": snapshot["snapshot_id"]}).json()
    assert restored["observation"] == before[-1][0]  # it starts where the original stands
    assert restored["env_id"] != original
    after = random_calls(rng, 300)
    seen_original, _ = play(client, original, after)
    seen_restored, _ = play(client, restored["env_id"], after)
    assert seen_restored == seen_original  # observations, rewards and done, all 300 (and the resets)


def test_branches_are_independent_copies(client: httpx.Client) -> None:
    parent = create(client, seed=12)["env_id"]
    for tool_calls in random_calls(random.Random(3), 30):
        step(client, parent, tool_calls)
    children = client.post("/branch", json={"env_ids": [parent], "num_children": 3}).json()["env_branches"][parent]
    assert len(set(children)) == 3 and parent not in children
    moves = {
        children[0]: ["move_left"] * 3,
        children[1]: ["move_right"] * 3,
        children[2]: ["noop"] * 3,
        parent: ["noop"] * 3,
    }
    answers = {env_id: step(client, env_id, interact(*actions)) for env_id, actions in moves.items()}
    assert answers[children[2]]["observation"] == answers[parent]["observation"]  # same moves, same world
    positions = {tuple(answers[env_id]["observation"]["player_position"]) for env_id in children[:2]}
    assert len(positions) == 2  # different moves, different worlds: nothing is shared
    assert client.post("/terminate", json={"env_id": parent}).json() == {"ok": True}
    assert step(client, children[0], interact("noop"))["step_idx"] == answers[children[0]]["step_idx"] + 1


# --- the OpenEnv doors without the OpenEnv client: header auth, the Task API, MCP over HTTP and WebSocket -----

NOOPS = {"actions": ["noop"] * 4}


def mint(client: httpx.Client, **body: Any) -> dict[str, Any]:
    response = client.post("/openenv/tokens", json=body)
    assert response.status_code == 200, response.text
    token: dict[str, Any] = response.json()
    return token


def ws_url(base_url: str) -> str:
    return base_url.replace("http://", "ws://") + "/ws"


@pytest.fixture
def short_episodes(make_app_server: Any) -> AppServer:
    """Episodes of 20 crafter steps: 5 steps of 4 noops reach `done` (truncated)."""
    server: AppServer = make_app_server(episode_length=20)
    return server


def test_the_header_door_needs_the_key_and_a_session(short_episodes: AppServer) -> None:
    client, anonymous = short_episodes.client(), short_episodes.client(key=None)
    for method, path in [
        ("POST", "/reset"),
        ("POST", "/step"),
        ("GET", "/state"),
        ("GET", "/health"),
        ("POST", "/mcp"),
        ("GET", "/list_environments"),
        ("GET", "/crafter/splits"),
    ]:
        error(anonymous.request(method, f"/openenv{path}", content=b"{bad"), 401, "unauthorized")
    with pytest.raises(InvalidStatus):
        connect(ws_url(f"{short_episodes.base_url}/openenv"), open_timeout=5).close()
    reset = client.post("/openenv/reset", json={"task_id": "crafter/train/8", "episode_id": "e1"}).json()
    session_id = reset["metadata"]["session_id"]
    error(client.post("/openenv/step", json={"action": NOOPS}), 422, "missing_session_id")
    stepped = client.post("/openenv/step", json={"action": NOOPS, "session_id": session_id}).json()
    assert stepped["metadata"]["step_count"] == 1 and stepped["observation"]["metadata"] == stepped["metadata"]
    state = client.get("/openenv/state", params={"session_id": session_id}).json()
    assert (state["step_count"], state["episode_id"], state["seed"]) == (1, "e1", 8)
    error(client.get("/openenv/state", params={"session_id": "x" * 22}), 404, "session_not_found")
    error(client.post("/openenv/reset", json={"task_id": "crafter/eval/256"}), 422, "task_index_out_of_range")


def test_the_task_api_on_both_doors(client: httpx.Client) -> None:
    token_base = mint(client)["base_url"]
    with httpx.Client(trust_env=False) as plain:
        for base, http in ((token_base, plain), (f"{str(client.base_url).rstrip('/')}/openenv", client)):
            assert http.get(f"{base}/list_environments").json() == ["crafter"]
            splits = http.get(f"{base}/crafter/splits").json()
            assert [(split["name"], split["type"], split["num_tasks"]) for split in splits] == [
                ("train", "train", 2**31 - 256),
                ("eval", "test", 256),
            ]
            assert http.post(f"{base}/crafter/num_tasks", json={"split": "eval"}).json() == {"num_tasks": 256}
            listed = http.post(f"{base}/crafter/tasks", json={"split": "eval"}).json()
            assert len(listed["tasks"]) == 256 and listed["env_name"] == "crafter"
            task = http.post(f"{base}/crafter/task", json={"split": "eval", "index": 17}).json()["task"]
            assert task == listed["tasks"][17] and task["task_id"] == "crafter/eval/17"
            assert task["seed"] == 2**31 - 256 + 17 and task["config"] == {"area": [64, 64], "length": 10000}
            page = http.post(f"{base}/crafter/task_range", json={"split": "train", "start": 5, "stop": 8}).json()
            assert [t["task_id"] for t in page["tasks"]] == ["crafter/train/5", "crafter/train/6", "crafter/train/7"]
            tail = http.post(f"{base}/crafter/task_range", json={"split": "eval", "start": -2}).json()["tasks"]
            assert [t["index"] for t in tail] == [254, 255]
            error(http.get(f"{base}/minecraft/splits"), 404, "unknown_env")
            error(
                http.post(f"{base}/crafter/task", json={"split": "eval", "index": 256}), 422, "task_index_out_of_range"
            )
            error(http.post(f"{base}/crafter/num_tasks", json={"split": "dev"}), 422, "unknown_split")
            error(http.post(f"{base}/crafter/task_range", json={"split": "train"}), 422, "too_many_tasks")
            error(http.post(f"{base}/crafter/tasks", json={"split": "eval", "x": 1}), 422, "invalid_request")
            error(http.post(f"{base}/crafter/tasks", content=b"{"), 400, "invalid_json")


def test_mcp_over_http_and_the_websocket_frame(make_app_server: Any) -> None:
    server: AppServer = make_app_server(episode_length=20, sessions_max_envs=2)
    one, other = mint(server.client())["base_url"], mint(server.client())["base_url"]

    def rpc(base: str, method: str, **params: Any) -> httpx.Response:
        body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
        return httpx.post(f"{base}/mcp", json=body, trust_env=False, timeout=30)

    session_id = rpc(one, "openenv/session/create", task_id="crafter/train/2").json()["result"]["session_id"]
    called = rpc(one, "tools/call", name="interact_many", arguments={"actions": ["noop"]}, session_id=session_id)
    result = called.json()["result"]
    assert result["isError"] is False and result["structuredContent"]["seed"] == 2
    assert result["content"][0]["text"].startswith("Ran: noop.")
    foreign = rpc(other, "tools/call", name="observe", session_id=session_id).json()["error"]  # another token's
    assert (foreign["code"], foreign["data"]["code"]) == (-32602, "session_not_found")
    assert rpc(one, "tools/call", name="observe").json()["error"]["data"]["code"] == "missing_session_id"
    assert rpc(one, "nope").json()["error"]["code"] == -32601
    assert rpc(one, "openenv/session/create").status_code == 200  # the second of two envs
    refused = rpc(one, "openenv/session/create")
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
    assert refused.json()["error"]["data"]["code"] == "too_many_envs"
    assert rpc(one, "openenv/session/close", session_id=session_id).json()["result"]["closed"] is True
    with connect(ws_url(one), open_timeout=5) as socket:  # a plain connection: its own game until a tool call

        def ask(message: dict[str, Any]) -> dict[str, Any]:
            socket.send(json.dumps(message))
            reply: dict[str, Any] = json.loads(socket.recv(timeout=30))
            return reply

        ask({"type": "reset", "data": {"seed": 5}})
        ask({"type": "step", "data": {"actions": ["noop", "noop"]}})
        listed = ask({"type": "mcp", "data": {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}})
        assert listed["type"] == "mcp" and len(listed["data"]["result"]["tools"]) == 5
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "observe"}}
        observed = ask({"type": "mcp", "data": call})["data"]["result"]["structuredContent"]
        assert (observed["seed"], observed["step_idx"], observed["step_count"]) == (5, 2, 1)  # the game moved along
        assert ask({"type": "state"})["data"]["session_id"] == observed["session_id"]
        tool_step = ask(
            {
                "type": "step",
                "data": {"type": "call_tool", "tool_name": "interact_many", "arguments": {"actions": ["noop"]}},
            }
        )
        assert tool_step["data"]["observation"]["tool_name"] == "interact_many" and tool_step["data"]["reward"] == 0
        assert (
            ask({"type": "step", "data": {"type": "list_tools"}})["data"]["observation"]["tools"][0]["name"] == "start"
        )
    wait_until(lambda: server.health()["sessions"]["websockets"] == 0)
    with connect(ws_url(one) + "?session_id=" + "x" * 22, open_timeout=5) as unknown:
        assert json.loads(unknown.recv(timeout=10))["data"]["code"] == "SESSION_ERROR"


def test_websocket_messages_go_uncompressed(make_app_server: Any) -> None:
    """The client offers permessage-deflate (websockets' default); the server declines it, so no message
    costs either end a zlib pass (docs/decisions/websocket.md)."""
    server: AppServer = make_app_server()
    with connect(ws_url(mint(server.client())["base_url"]), open_timeout=5) as socket:
        assert "permessage-deflate" in (socket.request.headers.get("Sec-WebSocket-Extensions") or "")
        assert socket.response.headers.get("Sec-WebSocket-Extensions") is None
        socket.send(json.dumps({"type": "reset", "data": {"seed": 3}}))
        assert json.loads(socket.recv(timeout=30))["type"] == "observation"
