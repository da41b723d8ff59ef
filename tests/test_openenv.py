"""OpenEnv under /openenv, tested with the real `openenv-core` package: its client plays an episode over
the WebSocket, its runtime validation (`openenv validate`'s checks) passes, and the tokens that stand in
for the API key expire, can be revoked, and never appear in a log line (uvicorn's access log included)."""

from __future__ import annotations

import asyncio
import copy
import json
import time
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("openenv", reason="the OpenEnv client runs in its own virtualenv: .ci/openenv")

from conftest import TEST_KEY, AppServer, server_process
from conftest import expect_error as error
from openenv.cli._validation import validate_running_environment
from openenv.core.generic_client import GenericEnvClient
from uvicorn.config import LOGGING_CONFIG
from websockets.exceptions import ConnectionClosedError, InvalidStatus
from websockets.sync.client import connect

pytestmark = pytest.mark.usefixtures("no_key_in_logs")


def mint(client: httpx.Client, **body: Any) -> dict[str, Any]:
    response = client.post("/openenv/tokens", json=body)
    assert response.status_code == 200, response.text
    token: dict[str, Any] = response.json()
    return token


def ws_url(base_url: str) -> str:
    return base_url.replace("http://", "ws://") + "/ws"


async def play_over_websocket(base_url: str, seed: int, moves: list[list[str]]) -> list[Any]:
    seen: list[Any] = []
    async with GenericEnvClient(base_url=base_url) as env:
        result = await env.reset(seed=seed)
        seen.append((result.observation["text"], result.reward, result.done))
        for actions in moves:
            result = await env.step({"actions": actions})
            seen.append((result.observation["text"], result.reward, result.done))
        state = await env.state()
        seen.append((state["step_count"], state["seed"]))
    return seen


def test_the_openenv_client_plays_the_same_episode_as_the_step_api(client: httpx.Client) -> None:
    token = mint(client)
    assert set(token) == {"token", "expires_at", "base_url"}
    assert token["base_url"] == f"{str(client.base_url).rstrip('/')}/openenv/t/{token['token']}"
    moves = [["move_left", "do"], ["move_up"], ["do", "do", "noop"]] * 10
    over_ws = asyncio.run(play_over_websocket(token["base_url"], 17, moves))
    env_id = client.post("/create", json={"env_name": "crafter", "seed": 17}).json()["env_id"]
    over_http = [client.post("/reset", json={"env_id": env_id}).json()["observation"]["text"]]
    for actions in moves:
        answer = client.post(
            "/step", json={"env_id": env_id, "tool_calls": [{"tool": "interact_many", "args": {"actions": actions}}]}
        ).json()
        over_http.append(answer["observation"]["text"])
    assert [text for text, *_ in over_ws[:-1]] == over_http
    assert over_ws[-1] == (len(moves), 17)  # step_count: step calls, not crafter steps


def test_openenv_runtime_validation_passes(client: httpx.Client) -> None:
    report = validate_running_environment(mint(client)["base_url"], timeout_s=10)
    assert report["passed"] is True, json.dumps(report["criteria"], indent=1)
    assert report["mode"] == "simulation" and report["standard_profile"] == "openenv-http/1.x"
    assert report["summary"]["failed_criteria"] == []


def test_openenv_http_routes_drive_the_tokens_env(client: httpx.Client) -> None:
    base = mint(client, seed=4)["base_url"]
    with httpx.Client(trust_env=False) as plain:  # no key: the token in the path is the credential
        assert plain.get(f"{base}/state").json() == {
            "episode_id": None,
            "step_count": 0,
            "seed": None,
            "done": False,
            "achievements": [],
        }
        error(plain.post(f"{base}/step", json={"action": {"actions": ["noop"]}}), 409, "not_reset")
        reset = plain.post(f"{base}/reset", json={}).json()
        assert set(reset) == {"observation", "reward", "done", "metadata"} and reset["reward"] is None
        assert reset["metadata"]["task_id"] == "crafter/train/4" and reset["metadata"]["session_id"]
        stepped = plain.post(f"{base}/step", json={"action": {"actions": ["move_left", "bogus"]}}).json()
        assert stepped["observation"]["actions"] == ["move_left"]
        assert stepped["observation"]["rejected"] == [{"item": "bogus", "reason": "unknown action"}]
        assert plain.get(f"{base}/state").json()["step_count"] == 1
        assert plain.post(f"{base}/reset", json={"seed": 9}).json()["observation"]["step_idx"] == 0
        assert plain.get(f"{base}/state").json()["seed"] == 9
        error(plain.post(f"{base}/step", json={"action": {"dance": 1}}), 422, "invalid_request")
        error(plain.post(f"{base}/step", json={}), 422, "invalid_request")
        error(plain.post(f"{base}/reset", content=b"{nope"), 400, "invalid_json")
        assert plain.get(f"{base}/health").json() == {"status": "healthy"}
        assert plain.get(f"{base}/metadata").json()["name"] == "crafter"
        assert set(plain.get(f"{base}/schema").json()) == {"action", "observation", "state"}
        assert plain.post(f"{base}/mcp", json={}).json()["error"]["code"] == -32600
        tools = plain.post(f"{base}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).json()
        assert [tool["name"] for tool in tools["result"]["tools"]][:2] == ["start", "interact_many"]


def test_tokens_expire_are_revocable_and_stand_for_nothing_else(client: httpx.Client, app_server: AppServer) -> None:
    anonymous = app_server.client(key=None)
    error(anonymous.post("/openenv/tokens", json={}), 401, "unauthorized")
    token = mint(client, ttl_s=10**9)
    lifetime = datetime.fromisoformat(token["expires_at"]) - datetime.now(UTC)
    assert 3590 < lifetime.total_seconds() <= 3600  # capped at TASKAPP_OPENENV_TOKEN_TTL_S
    base = token["base_url"]
    with httpx.Client(trust_env=False) as plain:
        plain.post(f"{base}/reset", json={})
        error(app_server.client(key=token["token"]).get("/info"), 401, "unauthorized")  # not an API key
        error(plain.get(base.replace(token["token"], token["token"][:-1] + "x") + "/health"), 401, "unauthorized")
        error(plain.get(f"{str(client.base_url).rstrip('/')}/openenv/t/short/health"), 401, "unauthorized")
        assert client.post("/openenv/tokens/revoke", json={"token": token["token"]}).json() == {"ok": True}
        error(plain.get(f"{base}/health"), 401, "unauthorized")
        error(client.post("/openenv/tokens/revoke", json={"token": token["token"]}), 404, "token_not_found")
    with pytest.raises(InvalidStatus):
        connect(ws_url(base), open_timeout=5).close()
    error(client.post("/openenv/tokens", json={"config": {"area": [1, 1]}}), 422, "invalid_env_config")
    other = mint(client)
    schema = httpx.get(f"{other['base_url']}/openapi.json", trust_env=False).text
    assert token["token"] not in schema and other["token"] not in schema  # no client sees a token in it


def test_a_token_expires(make_app_server: Any) -> None:
    server: AppServer = make_app_server(openenv_token_ttl_s=1)
    token = mint(server.client())
    assert httpx.get(f"{token['base_url']}/health", trust_env=False).status_code == 200
    time.sleep(2.2)  # lifetime 1 s, plus the 1 s a verdict may be cached
    error(httpx.get(f"{token['base_url']}/health", trust_env=False), 401, "unauthorized")


def test_websocket_protocol_errors_and_the_capacity_reply(make_app_server: Any) -> None:
    server: AppServer = make_app_server(openenv_max_sessions=1)
    base = mint(server.client())["base_url"]
    with connect(ws_url(base), open_timeout=5) as socket:

        def ask(message: str) -> dict[str, Any]:
            socket.send(message)
            reply: dict[str, Any] = json.loads(socket.recv(timeout=10))
            return reply

        assert ask("not json")["data"]["code"] == "INVALID_JSON"
        assert ask('{"type": "dance"}')["data"]["code"] == "UNKNOWN_TYPE"
        assert ask('{"type": "step", "data": {"actions": ["noop"]}}')["data"]["code"] == "EXECUTION_ERROR"
        assert ask('{"type": "reset", "data": {"seed": -1}}')["data"]["code"] == "VALIDATION_ERROR"
        assert ask('{"type": "step", "data": {"jump": true}}')["data"]["code"] == "VALIDATION_ERROR"
        reset = ask('{"type": "reset", "data": {"seed": 2, "episode_id": "ep-1"}}')
        assert reset["type"] == "observation" and reset["data"]["done"] is False
        assert ask('{"type": "state"}')["data"]["episode_id"] == "ep-1"
        with connect(ws_url(base), open_timeout=5) as second:  # one session is the cap
            refused = json.loads(second.recv(timeout=10))
            assert refused["type"] == "error" and refused["data"]["code"] == "CAPACITY_REACHED"
            assert (refused["data"]["active_sessions"], refused["data"]["max_sessions"]) == (1, 1)
        # the stock client finds the connection closed with 1013 (try again later) or reads the error first
        with pytest.raises((RuntimeError, ConnectionClosedError), match="CAPACITY_REACHED|1013"):
            asyncio.run(play_over_websocket(base, 1, []))
        socket.send('{"type": "close"}')
    assert server.health()["sessions"]["websockets"] == 0


def test_http_sessions_span_processes_and_tokens_stay_out_of_logs(tmp_path: Path) -> None:
    backend = f"sqlite:{tmp_path / 'state.db'}"
    # uvicorn's own logging config, its access log to stderr (which server_process writes to the log file)
    config = copy.deepcopy(LOGGING_CONFIG)
    config["handlers"]["access"]["stream"] = "ext://sys.stderr"
    logged = {"access_log": True, "log_level": "info", "log_config": config}
    with (
        server_process(tmp_path, state_backend=backend, traces_db=tmp_path / "a.db", uvicorn=logged) as first,
        server_process(tmp_path, state_backend=backend, traces_db=tmp_path / "b.db", uvicorn=logged) as second,
    ):
        with first.client() as a:
            token = a.post("/openenv/tokens", json={"seed": 6}).json()
        on_first, on_second = token["base_url"], token["base_url"].replace(first.base_url, second.base_url)
        with httpx.Client(trust_env=False) as plain:
            plain.post(f"{on_first}/reset", json={})
            plain.post(f"{on_second}/step", json={"action": {"actions": ["noop", "noop"]}})
            assert plain.get(f"{on_first}/state").json()["step_count"] == 1  # one env, served by both
        asyncio.run(play_over_websocket(on_second, 3, [["noop"]]))
        with first.client() as a, second.client() as b:  # a session of the header door, and its tools
            reset = a.post("/openenv/reset", json={"task_id": "crafter/eval/1"}).json()
            session_id = reset["metadata"]["session_id"]
            b.post("/openenv/step", json={"action": {"actions": ["noop"]}, "session_id": session_id})
            assert a.get("/openenv/state", params={"session_id": session_id}).json()["step_count"] == 1
            call = {"name": "interact_many", "arguments": {"actions": ["noop"]}, "session_id": session_id}
            answer = b.post("/openenv/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call})
            assert answer.json()["result"]["structuredContent"]["step_count"] == 2
        logs = [server.log_path for server in (first, second)]
    text = "\n".join(path.read_text() for path in logs)
    assert "/openenv/t/***/reset" in text and "/openenv/t/***/ws" in text  # the access log is on...
    assert token["token"] not in text and token["token"][:12] not in text  # ...and holds no token
    assert TEST_KEY not in text


# --- the current doors: header auth, MCP, the Task API (openenv 0.10 and 0.4.1 clients) ---------------------

OPENENV = tuple(int(part) for part in version("openenv").split(".")[:2])
headers_client = pytest.mark.skipif(OPENENV < (0, 9), reason="EnvClient(headers=...) arrived in openenv 0.9")
NOOPS = {"actions": ["noop"] * 4}


@pytest.fixture
def short_episodes(make_app_server: Any) -> AppServer:
    """Episodes of 20 crafter steps: 5 steps of 4 noops reach `done` (truncated)."""
    server: AppServer = make_app_server(episode_length=20)
    return server


def play_to_done_sync(env: Any) -> list[Any]:
    result = env.reset(task_id="crafter/eval/4", episode_id="ep-sync")
    seen = [result.metadata["task_id"]]
    while not result.done:
        result = env.step(NOOPS)
    state = env.state()
    return [*seen, state["step_count"], state["episode_id"], result.metadata["step_count"]]


@headers_client
def test_the_openenv_client_plays_to_done_with_the_key_in_a_header(short_episodes: AppServer) -> None:
    base = f"{short_episodes.base_url}/openenv"

    async def play() -> list[Any]:
        async with GenericEnvClient(base_url=base, headers={"X-API-Key": TEST_KEY}) as env:
            result = await env.reset(seed=3, episode_id="ep-async")
            steps = 0
            while not result.done:
                result = await env.step({"actions": ["move_left", "bogus", "noop", "noop", "noop"]})
                steps += 1
            state = await env.state()
            rejected = result.metadata["rejected"]
            return [steps, state["step_count"], state["episode_id"], state["task_id"], rejected]

    assert asyncio.run(play()) == [5, 5, "ep-async", "crafter/train/3", [{"item": "bogus", "reason": "unknown action"}]]
    with GenericEnvClient(base_url=base, headers={"Authorization": f"Bearer {TEST_KEY}"}).sync() as env:
        assert play_to_done_sync(env) == ["crafter/eval/4", 5, "ep-sync", 5]
    with pytest.raises(ConnectionError, match="403"):
        with GenericEnvClient(base_url=base, headers={"X-API-Key": "not-the-key"}).sync() as env:
            env.reset()


def test_mcp_tool_client_plays_an_episode(short_episodes: AppServer) -> None:
    """openenv >= 0.5: HTTP openenv/session/create + the WebSocket attached with ?session_id=; before: tool
    calls as steps over the WebSocket. Both through a token URL; 0.9+ also with the key in a header."""
    from openenv.core.mcp_client import MCPToolClient

    token_base = mint(short_episodes.client())["base_url"]
    doors = [(token_base, None)]
    if OPENENV >= (0, 9):
        doors.append((f"{short_episodes.base_url}/openenv", {"X-API-Key": TEST_KEY}))

    async def play(base: str, headers: dict[str, str] | None) -> list[Any]:
        extra = {"headers": headers} if headers else {}
        async with MCPToolClient(base_url=base, **extra) as env:
            names = [tool.name for tool in await env.list_tools()]
            started = await env.call_tool("start", task_id="crafter/eval/2")
            result, calls = started, 0
            while not result["done"]:
                result = await env.call_tool("interact_many", actions=["noop"] * 4)
                calls += 1
            saved = await env.call_tool("snapshot")
            again = await env.call_tool("restore", snapshot_id=saved["snapshot_id"])
            with pytest.raises(RuntimeError, match="unknown_tool|fly"):
                await env.call_tool("fly")
            return [names, started["task_id"], calls, result["step_count"], again["done"]]

    for base, headers in doors:
        names, task_id, calls, step_count, done = asyncio.run(play(base, headers))
        assert names == ["start", "interact_many", "observe", "snapshot", "restore"]
        assert (task_id, calls, step_count, done) == ("crafter/eval/2", 5, 5, True)
