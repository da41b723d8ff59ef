"""MCP at /mcp, tested with the `mcp` SDK's own client (1.x here; the 2.x client in `.ci/mcp-2`): it plays an
episode to `done`, snapshots and restores, continues an episode on a second app process sharing
`sqlite:PATH`, and meets the key, the caps and bad input with precise answers."""

from __future__ import annotations

import re
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult
from support.errors import error_body as error
from support.keys import TEST_KEY
from support.polling import wait_until
from support.processes import server_processes
from support.servers import AppServer

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("no_key_in_logs")]

SHORT_EPISODE = 24  # crafter steps: the episode ends (truncated) within a few calls
MOVES = ["move_left", "do", "noop"]


@asynccontextmanager
async def mcp_session(base_url: str, headers: dict[str, str] | None = None) -> AsyncIterator[ClientSession]:
    """The SDK's client over streamable HTTP, presenting the key as the app's other doors take it."""
    sent = {"X-API-Key": TEST_KEY} if headers is None else headers
    async with httpx.AsyncClient(headers=sent, timeout=30.0, trust_env=False) as http:
        async with streamable_http_client(f"{base_url}/mcp", http_client=http) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result: CallToolResult = await session.call_tool(tool, arguments)
    assert not result.isError, result.content
    assert result.structuredContent is not None
    return result.structuredContent


async def failed(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert result.isError and result.structuredContent is not None, result
    error: dict[str, Any] = result.structuredContent["error"]
    return error


@pytest.fixture
def short_app(make_app_server: Callable[..., AppServer]) -> AppServer:
    return make_app_server(episode_length=SHORT_EPISODE, warm_up=False)


def test_the_sdk_client_plays_an_episode_to_done(short_app: AppServer) -> None:
    async def play() -> None:
        async with mcp_session(short_app.base_url) as session:
            listed = await session.list_tools()
            names = [tool.name for tool in listed.tools]
            assert names == ["start", "interact_many", "observe", "snapshot", "restore", "end"]
            started = await call(session, "start", task_id="crafter/eval/3")
            assert started["task_id"] == "crafter/eval/3" and not started["done"]
            sid = started["session_id"]
            steps = []
            while not steps or not steps[-1]["done"]:
                steps.append(await call(session, "interact_many", session_id=sid, actions=MOVES))
                assert len(steps) <= SHORT_EPISODE
            assert steps[-1]["truncated"] and steps[-1]["step_idx"] == SHORT_EPISODE
            assert all(isinstance(step["reward"], float) for step in steps)
            assert all({"achievements_added", "rejected", "actions", "achievements"} <= set(step) for step in steps)
            over = await session.call_tool("interact_many", {"session_id": sid, "actions": MOVES})
            assert over.structuredContent and over.structuredContent["episode_over"]
            assert "episode is over" in over.content[0].text  # type: ignore[union-attr]
            again = await call(session, "start", session_id=sid, seed=9)  # the same session, a new episode
            assert again["session_id"] == sid and again["seed"] == 9 and again["step_idx"] == 0
            assert await call(session, "end", session_id=sid) == {"session_id": sid, "ended": True}
            assert (await failed(session, "observe", session_id=sid))["code"] == "session_not_found"

    anyio.run(play)


def test_snapshot_and_restore_go_back_in_an_episode(short_app: AppServer) -> None:
    async def branch() -> None:
        async with mcp_session(short_app.base_url) as session:
            sid = (await call(session, "start", seed=11))["session_id"]
            await call(session, "interact_many", session_id=sid, actions=["move_up", "do"])
            snapshot = (await call(session, "snapshot", session_id=sid))["snapshot_id"]
            here = (await session.call_tool("observe", {"session_id": sid})).content[0].text  # type: ignore[union-attr]
            after = await session.call_tool("interact_many", {"session_id": sid, "actions": MOVES})
            restored = await session.call_tool("restore", {"session_id": sid, "snapshot_id": snapshot})
            assert restored.structuredContent and restored.structuredContent["step_idx"] == 2
            assert here.split("\n\n", 1)[1] == restored.content[0].text.split("\n\n", 1)[1]  # type: ignore[union-attr]
            again = await session.call_tool("interact_many", {"session_id": sid, "actions": MOVES})
            assert again.content[0].text == after.content[0].text  # type: ignore[union-attr]  # deterministic

    anyio.run(branch)


def test_a_session_continues_on_a_second_process_sharing_the_store(tmp_path: Path) -> None:
    backend = f"sqlite:{tmp_path / 'state.db'}"
    settings = {"state_backend": backend, "episode_length": SHORT_EPISODE}
    with server_processes(
        tmp_path, {**settings, "traces_db": tmp_path / "a.db"}, {**settings, "traces_db": tmp_path / "b.db"}
    ) as (a, b):

        async def alternate() -> list[dict[str, Any]]:
            async with mcp_session(a.base_url) as first, mcp_session(b.base_url) as second:
                sid = (await call(first, "start", seed=5))["session_id"]
                steps = []
                for turn in range(4):
                    session = (first, second)[turn % 2]
                    steps.append(await call(session, "interact_many", session_id=sid, actions=MOVES))
                assert (await call(second, "observe", session_id=sid))["step_idx"] == steps[-1]["step_idx"]
                return steps

        steps = anyio.run(alternate)
        assert [step["step_idx"] for step in steps] == [3, 6, 9, 12]
        assert b.health()["sessions"]["rebuilds"] >= 1  # b rebuilt the episode's env from the store


def test_the_key_is_required_as_on_every_other_door(short_app: AppServer) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    anonymous = short_app.client(key=None)
    error(anonymous.post("/mcp", json=body), 401, "unauthorized")
    error(anonymous.post("/mcp", json=body, headers={"X-API-Key": "wrong"}), 401, "unauthorized")

    async def bearer() -> None:
        async with mcp_session(short_app.base_url, {"Authorization": f"Bearer {TEST_KEY}"}) as session:
            assert (await session.list_tools()).tools

    anyio.run(bearer)


def test_bad_arguments_and_unknown_names_are_tool_errors(short_app: AppServer) -> None:
    async def mistakes() -> None:
        async with mcp_session(short_app.base_url) as session:
            assert (await failed(session, "fly", session_id="x"))["code"] == "unknown_tool"
            assert (await failed(session, "interact_many", actions=["noop"]))["code"] == "invalid_tool_arguments"
            sid = (await call(session, "start"))["session_id"]  # a random training world
            assert (await failed(session, "interact_many", session_id=sid))["code"] == "invalid_tool_arguments"
            no_actions = await failed(session, "interact_many", session_id=sid, actions=[])
            assert no_actions["code"] == "invalid_tool_arguments"
            assert (await failed(session, "start", task_id="chess/1"))["code"] == "invalid_task_id"
            assert (await failed(session, "start", task_id="crafter/test/1"))["code"] == "unknown_split"
            assert (await failed(session, "start", seed=-1))["code"] == "invalid_tool_arguments"
            assert (await failed(session, "end", session_id=sid, extra=1))["code"] == "invalid_tool_arguments"
            missing = await failed(session, "restore", session_id=sid, snapshot_id="nope")
            assert missing["code"] == "snapshot_not_found"
            unknown = await failed(session, "interact_many", session_id="A" * 22, actions=["noop"])
            assert unknown["code"] == "session_not_found" and not unknown["retryable"]

    anyio.run(mistakes)


def test_an_env_cap_is_a_retryable_tool_error_with_retry_after(make_app_server: Callable[..., AppServer]) -> None:
    server = make_app_server(sessions_max_envs=1, warm_up=False)

    async def capped() -> None:
        async with mcp_session(server.base_url) as session:
            await call(session, "start", seed=1)
            refused = await failed(session, "start", seed=2)
            assert refused["code"] == "too_many_envs" and refused["retryable"] and refused["retry_after_s"] >= 1

    anyio.run(capped)


def test_requests_over_the_in_flight_cap_get_429_with_retry_after(make_app_server: Callable[..., AppServer]) -> None:
    server = make_app_server(mcp_max_in_flight=1, warm_up=False)
    host, port = server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as held:
        # A request whose body is still arriving holds the one in-flight place.
        held.sendall(
            b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAccept: application/json, "
            b"text/event-stream\r\nX-API-Key: " + TEST_KEY.encode() + b"\r\nContent-Length: 100\r\n\r\n{"
        )
        client = server.client()
        ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        wait_until(lambda: client.post("/mcp", json=ping).status_code == 429)  # once the held one is admitted
        response = client.post("/mcp", json=ping)
        error(response, 429, "mcp_busy")
        assert response.headers["Retry-After"] == "1"
        held.sendall(b" " * 99)


def test_the_docs_example_runs(
    short_app: AppServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = Path(__file__).resolve().parent.parent / "docs" / "doors" / "mcp.md"
    example = re.findall(r"```python\n(.*?)```", doc.read_text(encoding="utf-8"), re.S)[0]
    monkeypatch.setenv("TASK_APP_URL", short_app.base_url)
    monkeypatch.setenv("ENVIRONMENT_API_KEY", TEST_KEY)
    exec(compile(example, str(doc), "exec"), {})  # the page's own code, nothing else
    assert "return:" in capsys.readouterr().out
    assert short_app.state.sessions.envs.stats()["live"] == 0  # the example ended its session


def test_a_plain_tool_call_is_answered_as_the_sdk_answers_it(short_app: AppServer) -> None:
    """A bare tools/call is answered beside the SDK's transport (mcp_server.py); with `_meta` the SDK answers.
    Same call, same JSON: for a result, a tool error, and a malformed request (the SDK's own error)."""
    client = short_app.client()
    headers = {"Accept": "application/json, text/event-stream"}

    def both(name: str, arguments: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        params: dict[str, Any] = {"name": name, "arguments": arguments}
        bodies = [
            {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": p} for p in (params, {**params, "_meta": {}})
        ]
        answers = [client.post("/mcp", json=body, headers=headers) for body in bodies]
        assert [answer.status_code for answer in answers] == [200, 200]
        return answers[0].json(), answers[1].json()

    start = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "start", "arguments": {"seed": 3}}}
    started = client.post("/mcp", json=start, headers=headers).json()
    assert started["id"] == 1 and started["result"]["isError"] is False
    sid = started["result"]["structuredContent"]["session_id"]
    fast, sdk = both("observe", {"session_id": sid})
    assert fast == sdk and fast["result"]["structuredContent"]["session_id"] == sid
    fast, sdk = both("observe", {"session_id": "nope"})
    assert fast == sdk and fast["result"]["isError"] is True
    broken = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call"'
    malformed = client.post("/mcp", content=broken, headers={**headers, "Content-Type": "application/json"})
    assert malformed.status_code == 400 and malformed.json()["error"]["code"] == -32700  # the SDK's parse error
    # A revision outside the handshake's (a later per-request envelope, or none the SDK knows) is the SDK's:
    # it refuses one it does not speak, where the plain answer would have been a 200.
    later = client.post("/mcp", json=start, headers={**headers, "MCP-Protocol-Version": "2099-01-01"})
    assert later.status_code == 400, later.text
