"""The MCP door on the `mcp` SDK's 2.x line: its client (`mcp.Client`, httpx2; verifiers 0.4 pins mcp 2)
against the app's server on mcp 2.x (what a fresh install, e.g. Modal's image, gets) and on mcp 1.x (the
dev virtualenv's, whose openreward client keeps mcp below 2).

`.ci/mcp-2` runs this module in a virtualenv of its own (the checkout with `mcp>=2,<3`), with
`--noconftest`; the servers are child processes: this virtualenv's python, and the main one's
(`TASKAPP_SERVER_PYTHON`). Under the main suite it is skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

if int(version("mcp").split(".")[0]) < 2:
    pytest.skip("the mcp 2.x client runs in its own virtualenv (.ci/mcp-2)", allow_module_level=True)

import anyio
import httpx2
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
KEY = "tk-Qz7WxJvKpLmYrNsT"
SHORT_EPISODE = 24
START_TIMEOUT_S = 120.0


def _server(python: str, tmp_path: Path, **settings: Any) -> Iterator[str]:
    values = {"environment_api_key": KEY, "warm_up": False, "traces_db": str(tmp_path / "traces.db"), **settings}
    env = {name: value for name, value in os.environ.items() if not name.startswith("TASKAPP_")}
    log = (tmp_path / "server.log").open("w")
    process = subprocess.Popen(
        [python, "-m", "benchmarks.app_server", "--settings", json.dumps(values)],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, f"the server printed no port: {(tmp_path / 'server.log').read_text()[-2000:]}"
        base_url = f"http://127.0.0.1:{json.loads(line)['port']}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                if httpx2.get(f"{base_url}/health", timeout=2.0).status_code == 200:
                    break
            except httpx2.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not become ready"
            time.sleep(0.05)  # polling interval
        yield base_url
    finally:
        process.terminate()
        process.wait(timeout=30)
        if process.stdout is not None:
            process.stdout.close()
        log.close()


@pytest.fixture(scope="module", params=["server-on-mcp-2", "server-on-mcp-1"])
def base_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    python = sys.executable if request.param == "server-on-mcp-2" else os.environ.get("TASKAPP_SERVER_PYTHON")
    if not python:
        pytest.fail("set TASKAPP_SERVER_PYTHON to the main virtualenv's python (.ci/mcp-2 does)")
    yield from _server(python, tmp_path_factory.mktemp("mcp2"), episode_length=SHORT_EPISODE)


@asynccontextmanager
async def _client(base_url: str, headers: dict[str, str]) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers=headers, timeout=30.0) as http:
        async with Client(streamable_http_client(f"{base_url}/mcp", http_client=http)) as client:
            yield client


async def _call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    facts: dict[str, Any] = result.structured_content
    return facts


def test_the_2x_client_plays_an_episode_to_done(base_url: str) -> None:
    async def play() -> None:
        async with _client(base_url, {"X-API-Key": KEY}) as client:
            names = [tool.name for tool in (await client.list_tools()).tools]
            assert names == ["start", "interact_many", "observe", "snapshot", "restore", "end"]
            started = await _call(client, "start", task_id="crafter/eval/3")
            session = started["session_id"]
            snapshot = (await _call(client, "snapshot", session_id=session))["snapshot_id"]
            steps = []
            while not steps or not steps[-1]["done"]:
                steps.append(await _call(client, "interact_many", session_id=session, actions=["move_left", "do"]))
                assert len(steps) <= SHORT_EPISODE
            last = steps[-1]
            assert last["truncated"] and isinstance(last["reward"], float) and "achievements_added" in last
            restored = await _call(client, "restore", session_id=session, snapshot_id=snapshot)
            assert restored["step_idx"] == 0 and not restored["done"]
            assert (await _call(client, "end", session_id=session))["ended"]
            refused = await client.call_tool("observe", {"session_id": session})
            assert refused.is_error and refused.structured_content["error"]["code"] == "session_not_found"

    anyio.run(play)


def test_the_2x_client_is_refused_without_the_key(base_url: str) -> None:
    async def anonymous() -> None:
        async with _client(base_url, {}) as client:
            await client.list_tools()

    with pytest.raises(Exception, match="unhandled errors") as refused:  # the SDK's MCPError, in task groups
        anyio.run(anonymous)
    assert refused.group_contains(MCPError)
    answer = httpx2.post(f"{base_url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "unauthorized"
