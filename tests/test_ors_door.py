"""The Open Reward Standard on its own port, tested with the `openreward` client from PyPI: it lists the
splits and tasks, plays an episode to `finished`, and its calls land on env sessions in the state store,
so a session created on one app process is continued on another; bad input and caps get precise statuses."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ALIAS_KEY, TEST_KEY, assert_response_keeps_keys, wait_until
from conftest import expect_error as error
from openreward import OpenReward
from openreward.api.environments.types import ToolOutput
from openreward.environments.types import ListToolsOutput, RunToolOutput, Split
from pydantic import TypeAdapter

from task_app.core.settings import Settings
from task_app.web.local_server import serve_with_ors_in_thread
from task_app.web.server import create_app

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("no_key_in_logs")]

DOC = Path(__file__).resolve().parent.parent / "docs" / "doors" / "ors.md"
SHORT_EPISODE = 24  # crafter steps: an episode ends (truncated) within a few calls


@pytest.fixture(autouse=True)
def no_update_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client asks PyPI for a newer version of itself unless told not to (tests reach only loopback)."""
    monkeypatch.setenv("OPENREWARD_DISABLE_UPDATE_CHECK", "1")


class Doors:
    def __init__(self, main_url: str, ors_url: str) -> None:
        self.main_url, self.ors_url = main_url, ors_url

    def http(self, key: str | None = TEST_KEY, **headers: str) -> httpx.Client:
        merged = {"X-API-Key": key} if key is not None else {}
        merged.update(headers)
        return httpx.Client(base_url=self.ors_url, headers=merged, timeout=15.0, trust_env=False)


@pytest.fixture(scope="module")
def doors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Doors]:
    settings = Settings(
        environment_api_key=TEST_KEY,
        environment_api_key_aliases=[ALIAS_KEY],
        traces_db=tmp_path_factory.mktemp("ors") / "traces.db",
        episode_length=SHORT_EPISODE,
        warm_up=False,
    )
    with serve_with_ors_in_thread(create_app(settings)) as (main_url, ors_url):
        yield Doors(main_url, ors_url)


def sdk_env(doors: Doors, key: str = TEST_KEY) -> Any:
    client = OpenReward(api_key=key, base_url=doors.ors_url)
    return client, client.environments.get("crafter", base_url=doors.ors_url)


def test_the_client_lists_splits_and_tasks(doors: Doors) -> None:
    client, env = sdk_env(doors)
    with client:
        assert env.list_splits() == ["train", "eval"]
        assert env.num_tasks("train") > 1_000_000 and env.num_tasks("eval") == 256
        task = env.get_task("train", 7)
        assert task.task_spec["task_id"] == "crafter/train/7" and task.task_spec["seed"] == 7
        assert [t.task_spec["index"] for t in env.get_task_range("train", 3, 6)] == [3, 4, 5]
        held_out = env.list_tasks("eval")
        assert len(held_out) == 256 and held_out[17].task_spec["task_id"] == "crafter/eval/17"
        tools = env.list_tools()
        assert [tool.name for tool in tools] == ["interact_many"]
        assert tools[0].input_schema["required"] == ["actions"]


def test_the_client_plays_an_episode_to_finished(doors: Doors) -> None:
    client, env = sdk_env(doors)
    outputs: list[ToolOutput] = []
    with client, env.session(split="train", index=3) as session:
        prompt = session.get_prompt()
        assert "Crafter" in prompt[0].text and "interact_many" in prompt[0].text
        for _ in range(SHORT_EPISODE):
            output = session.call_tool("interact_many", {"actions": ["move_left", "do", "noop"]})
            outputs.append(output)
            if output.finished:
                break
    assert outputs[-1].finished and not any(output.finished for output in outputs[:-1])
    assert all(isinstance(output.reward, float) for output in outputs)
    last = outputs[-1].metadata
    assert last is not None and last["truncated"] and last["task_id"] == "crafter/train/3"
    assert {"achievements_added", "actions", "rejected", "step_idx", "reward", "done"} <= set(last)
    assert "The episode is over" in outputs[-1].blocks[0].text


def test_answers_have_the_sdk_servers_shapes(doors: Doors) -> None:
    with doors.http() as http:
        assert ListToolsOutput.model_validate(http.get("/tools").json())
        assert [Split.model_validate(split) for split in http.get("/crafter/splits").json()]
        created = http.post("/create_session")
        assert created.headers["content-type"].startswith("text/event-stream")
        sid = created.text.split("event: task_id\ndata: ")[1].split("\n")[0]
        response = http.post("/create", json={"split": "train", "index": 1}, headers={"X-Session-ID": sid})
        assert response.json() == {"sid": sid}
        call = http.post(
            "/crafter/call",
            json={"name": "interact_many", "input": {"actions": ["noop"]}},
            headers={"X-Session-ID": sid},
        )
        end = call.text.split("event: end\ndata: ")[1].split("\n")[0]
        assert TypeAdapter(RunToolOutput).validate_json(end).root.ok
        assert http.post("/delete", headers={"X-Session-ID": sid}).json() == {"sid": sid}
        error(http.get("/prompt", headers={"X-Session-ID": sid}), 404, "ors_session_not_found")


def test_every_route_wants_the_key(doors: Doors) -> None:
    with doors.http(key=None) as http:
        error(http.get("/list_environments"), 401, "unauthorized")
        error(http.post("/create_session"), 401, "unauthorized")
        error(
            http.post("/create", json={"split": "train", "index": 1}, headers={"X-Session-ID": "x" * 22}),
            401,
            "unauthorized",
        )
        assert http.get("/health").json() == {"status": "ok"}
    with doors.http(key="wrong") as http:
        error(http.post("/crafter/call", json={"name": "interact_many", "input": {}}), 401, "unauthorized")


def test_bad_input_gets_precise_statuses(doors: Doors) -> None:
    with doors.http() as http:
        error(http.post("/create", json={"split": "train", "index": 1}), 400, "missing_session_id")
        sid = "A" * 22
        error(
            http.post("/create", json={"split": "nope", "index": 1}, headers={"X-Session-ID": sid}),
            422,
            "unknown_split",
        )
        error(http.post("/create", json={"split": "train"}, headers={"X-Session-ID": sid}), 422, "invalid_request")
        error(http.post("/task", json={"split": "train", "index": 2**40}), 422, "task_index_out_of_range")
        error(http.get("/chess/tools"), 404, "unknown_environment")
        error(
            http.post("/call", json={"name": "interact_many", "input": {}}, headers={"X-Session-ID": sid}),
            404,
            "ors_session_not_found",
        )
        error(http.post("/tasks", json={"split": "train"}), 422, "too_many_tasks")
        error(http.post("/task_range", json={"split": "train", "stop": 257}), 422, "too_many_tasks")  # past a page
        spec = {"task_spec": {"task_id": "crafter/eval/9999"}}
        error(http.post("/create", json=spec, headers={"X-Session-ID": sid}), 422, "task_index_out_of_range")
        response = http.post("/create", content=b"{", headers={"X-Session-ID": sid, "content-type": "application/json"})
        error(response, 400, "invalid_json")
        assert_response_keeps_keys(response)


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S)


def test_the_docs_example_runs(
    doors: Doors, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TASKAPP_ORS_URL", doors.ors_url)
    monkeypatch.setenv("ENVIRONMENT_API_KEY", TEST_KEY)
    example = python_blocks(DOC)[0]
    exec(compile(example, str(DOC), "exec"), {})  # the page's own code, nothing else
    printed = capsys.readouterr().out
    assert "['train', 'eval']" in printed and "return:" in printed


def test_trls_openrewardspec_calls_work_against_the_door(doors: Doors, monkeypatch: pytest.MonkeyPatch) -> None:
    """What `OpenRewardSpec(url, api_key=..., num_tasks=N)` does with the client (TRL 1.16's
    trl/experimental/openreward): a client on the URL, any env name, tasks by index, one session per
    episode, the prompt's text, tools called by name; the session URL from the environment, as the docs say."""
    trl_example = python_blocks(DOC)[1]
    assert 'os.environ["OPENREWARD_SESSION_URL"] = os.environ["TASKAPP_ORS_URL"]' in trl_example
    assert 'OpenRewardSpec(os.environ["TASKAPP_ORS_URL"]' in trl_example and "num_tasks=" in trl_example
    compile(trl_example, str(DOC), "exec")
    monkeypatch.setenv("OPENREWARD_SESSION_URL", doors.ors_url)
    client = OpenReward(api_key=TEST_KEY, base_url=doors.ors_url)
    with client:
        env = client.environments.get("env")  # TRL's name for a self-hosted URL
        specs = [env.get_task("train", index).task_spec for index in range(min(3, env.num_tasks("train")))]
        tools = env.list_tools()
        assert [spec["task_id"] for spec in specs] == ["crafter/train/0", "crafter/train/1", "crafter/train/2"]
        with env.session(split="train", index=2) as session:
            assert session.get_prompt()[0].text
            rewards = []
            while True:
                output = session.call_tool(tools[0].name, {"actions": ["move_right", "do"]})
                rewards.append(output.reward)
                if output.finished:
                    break
        assert len(rewards) <= SHORT_EPISODE


def test_a_session_continues_on_another_app_sharing_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two apps on one `sqlite:PATH` store (two containers, as far as ORS can tell): the client's session,
    created through one, is pinged, called and deleted through the other."""

    def app(name: str) -> Any:
        settings = Settings(
            environment_api_key=TEST_KEY,
            traces_db=tmp_path / f"{name}.db",
            state_backend=f"sqlite:{tmp_path / 'state.db'}",
            episode_length=SHORT_EPISODE,
            warm_up=False,
        )
        return create_app(settings)

    with serve_with_ors_in_thread(app("a")) as (_, first), serve_with_ors_in_thread(app("b")) as (_, second):
        client = OpenReward(api_key=TEST_KEY, base_url=first)
        with client:
            env = client.environments.get("crafter", base_url=first)
            with env.session(split="train", index=5) as session:
                session.call_tool("interact_many", {"actions": ["noop"]})
                sid = session.sid
                with Doors(first, second).http(**{"X-Session-ID": sid}) as other:
                    call = other.post("/call", json={"name": "interact_many", "input": {"actions": ["do"]}})
                    end = call.text.split("event: end\ndata: ")[1].split("\n")[0]
                    assert TypeAdapter(RunToolOutput).validate_json(end).root.output.metadata["step_idx"] == 2
                    assert other.post("/ping").json() == {"status": "ok"}
                output = session.call_tool("interact_many", {"actions": ["noop"]})
                assert output.metadata is not None and output.metadata["step_idx"] == 3  # one episode, both apps
            with Doors(first, second).http(**{"X-Session-ID": sid}) as other:
                error(other.get("/prompt"), 404, "ors_session_not_found")  # the client's delete, seen by both


@pytest.mark.parametrize("processes", [1, 2])
def test_task_app_serve_answers_ors_on_its_second_port(tmp_path: Path, processes: int) -> None:
    """`task-app serve --ors-port`: the app on one port, ORS on the other, from every process."""
    port, ors_port = _free_port(), _free_port()
    environment = {
        **{name: value for name, value in os.environ.items() if not name.startswith("TASKAPP_")},
        "ENVIRONMENT_API_KEY": TEST_KEY,
        "TASKAPP_TRACES_DB": str(tmp_path / "t.db"),
        "TASKAPP_STATE_BACKEND": f"sqlite:{tmp_path / 'state.db'}",
        "TASKAPP_WARM_UP": "false",
    }
    command = [str(Path(sys.executable).with_name("task-app")), "serve", "--port", str(port)]
    command += ["--ors-port", str(ors_port), "--processes", str(processes)]
    with subprocess.Popen(
        command, cwd=tmp_path, env=environment, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    ) as server:  # fmt: skip
        try:

            def up() -> bool:
                assert server.poll() is None, "task-app serve exited"
                try:
                    return httpx.get(f"http://127.0.0.1:{ors_port}/health", timeout=2.0, trust_env=False).is_success
                except httpx.TransportError:
                    return False

            wait_until(up, timeout=120.0, interval=0.05)
            headers = {"X-API-Key": TEST_KEY, "Connection": "close"}  # each request on a new connection
            for _ in range(6):  # whichever process takes the connection serves both doors
                ors = httpx.get(f"http://127.0.0.1:{ors_port}/list_environments", headers=headers, trust_env=False)
                assert ors.json() == ["crafter"]
                main = httpx.get(f"http://127.0.0.1:{port}/info", headers=headers, trust_env=False)
                assert main.status_code == 200 and "crafter" in main.text
            assert httpx.get(f"http://127.0.0.1:{port}/list_environments", headers=headers).status_code == 404
        finally:
            server.send_signal(signal.SIGINT)
            output, _ = server.communicate(timeout=60)
    assert server.returncode == 0, output


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
