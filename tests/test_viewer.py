"""The episode viewer: the page's content, `task-app view`, `GET /runs/{run_id}/view`, and the page in
headless Chromium (frame, counter and texts move together; play/pause; keyboard; timeline)."""

from __future__ import annotations

import base64
import io
import sqlite3
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from support import browser
from support.errors import error_body
from support.keys import TEST_KEY
from support.pages import EXTERNAL, page_data
from support.policies import FakeLLMPolicy
from support.polling import wait_until
from support.rollouts import deaths_rollout, llm_rollout, make_plan, request_body, run_rollout
from support.servers import AppServer
from support.traces import load_session, run_cli, store_all

from task_app.core.settings import Settings
from task_app.game import WorldFactory
from task_app.inspection.replay import run_from_trace
from task_app.inspection.viewer import DISPLAY_SIZE, FRAME_SIZE, build_episode_page, page_name
from task_app.policy.scripted import ScriptedPolicy
from task_app.rollout.result import RolloutResult
from task_app.web.local_server import serve_in_thread
from task_app.web.routes import view
from task_app.web.server import create_app


@pytest.fixture(scope="module")
def scripted(worlds: WorldFactory) -> RolloutResult:
    """The built-in scripted policy on seed 3: it collects wood, crafts and meets the night."""
    plan = make_plan(
        run_id="scripted-3", env={"seed": 3}, policy={"config": {"max_llm_calls": 60}}, ops=["agent", "env"] * 60
    )
    return run_rollout(plan, ScriptedPolicy(max_actions=8, seed=3), worlds)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory, worlds: WorldFactory, scripted: RolloutResult) -> Path:
    return store_all(tmp_path_factory.mktemp("viewer") / "traces.db", scripted, deaths_rollout(worlds))


# --- the page -------------------------------------------------------------------------------------


def test_page_has_a_position_per_decision_and_episode_end(db: Path, worlds: WorldFactory) -> None:
    run = run_from_trace(load_session(db, "deaths"))
    page = build_episode_page(run, worlds)
    assert page.outcome.ok
    data = page_data(page.html)
    points = data["positions"]
    ends = [point for point in points if point["kind"] == "end"]
    assert len(points) == len(run.decisions) + len(ends)
    assert len(ends) == page.outcome.episodes  # every death, plus the end of the rollout
    assert [end["title"] for end in ends[:-1]] == [f"Episode {i} over: the player died" for i in range(len(ends) - 1)]
    assert all(point["frame"] is not None for point in points)
    assert ends[0]["vitals"]["health"] == 0
    first = Image.open(io.BytesIO(base64.b64decode(data["frames"][0])))
    assert first.format == "PNG" and first.size == (FRAME_SIZE, FRAME_SIZE)
    assert f"width: {DISPLAY_SIZE}px" in page.html


def test_page_is_self_contained(db: Path, worlds: WorldFactory) -> None:
    page = build_episode_page(run_from_trace(load_session(db, "scripted-3")), worlds).html
    assert EXTERNAL.search(page) is None
    assert "<script src" not in page and "Replay verified: all 60 decisions" in page
    assert page.count('class="unlock"') >= 3 and page.count("data-pos=") >= 3  # unlock markers, timeline
    assert page.count("<polyline") == 4  # health, food, drink, energy


def test_recorded_text_cannot_break_out_of_the_page(tmp_path: Path, worlds: WorldFactory) -> None:
    result = llm_rollout(worlds, run_id="evil", decisions=3, policy=FakeLLMPolicy(seed=1))
    trace = load_session(store_all(tmp_path / "t.db", result), "evil")
    trace["session_id"] = "evil</script>"  # run ids are restricted on the wire; the page must not rely on it
    hostile = "</script><img src=x onerror=alert(1)> & <b>bold</b>"
    trace["session_time_steps"][1]["events"][0]["call_records"][0]["output_text"] = hostile
    page = build_episode_page(run_from_trace(trace), worlds).html
    assert "<img src=x" not in page and "</script><img" not in page and "<b>bold" not in page
    data = page_data(page)
    assert data["run_id"] == "evil</script>"
    assert data["positions"][1]["message"] == hostile
    assert "Episode viewer · evil&lt;/script&gt;" in page


def test_a_diverged_replay_is_shown_and_frames_stop(db: Path, tmp_path: Path, worlds: WorldFactory) -> None:
    trace = load_session(db, "deaths")
    next(event for event in trace["session_time_steps"][3]["events"] if "reward" in event)["reward"] = 2.0
    page = build_episode_page(run_from_trace(trace), worlds)
    assert page.outcome.mismatch is not None
    assert "Replay diverged at decision 3 (episode 1) — reward" in page.html
    points = page_data(page.html)["positions"]
    decisions = [point for point in points if point["kind"] == "decision"]
    assert all(point["frame"] is not None for point in decisions[:4])
    assert all(point["frame"] is None for point in decisions[4:])
    assert all(point["vitals"] for point in points)  # read from the recorded observation text instead


def test_page_names() -> None:
    assert page_name("eval-3-ab12") == "eval-3-ab12.html"
    assert page_name("../../etc/passwd").startswith("etc_passwd-") and "/" not in page_name("a/b")


# --- task-app view --------------------------------------------------------------------------------


def test_view_command(db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.chdir(tmp_path)
    assert run_cli(["view", "deaths", "--db", str(db)]) == 0
    page = (tmp_path / "deaths.html").read_text(encoding="utf-8")
    assert "Replay verified" in page and "Wrote deaths.html" in capsys.readouterr().err
    target = tmp_path / "out" / "page.html"
    assert run_cli(["view", "scripted-3", "--db", str(db), "-o", str(target), "--frame-size", "64"]) == 0
    assert Image.open(io.BytesIO(base64.b64decode(page_data(target.read_text())["frames"][0]))).size == (64, 64)
    assert run_cli(["view", "missing", "--db", str(db)]) == 2
    assert "no run 'missing'" in capsys.readouterr().err
    assert run_cli(["view", "deaths", "--db", str(db), "--frame-size", "5"]) == 2


def test_view_command_warns_about_a_divergence(tmp_path: Path, worlds: WorldFactory, capsys: Any) -> None:
    path = store_all(tmp_path / "t.db", deaths_rollout(worlds, "bad", 4))
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE events SET reward = 5 WHERE event_type = 'environment' AND message_time = 1")
    assert run_cli(["view", "bad", "--db", str(path), "-o", str(tmp_path / "bad.html")]) == 0
    assert "diverged at decision 1 (reward)" in capsys.readouterr().err
    assert "Replay diverged at decision 1" in (tmp_path / "bad.html").read_text()


# --- GET /runs/{run_id}/view ----------------------------------------------------------------------


@contextmanager
def view_server(directory: Path, **overrides: Any) -> Iterator[AppServer]:
    """The app with the viewer route (included here unless server.py already registers it)."""
    settings = Settings(environment_api_key=TEST_KEY, traces_db=directory / "traces.db", warm_up=False, **overrides)
    app = create_app(settings)
    if not any(getattr(route, "path", None) == "/runs/{run_id}/view" for route in app.routes):
        app.include_router(view.router)
    with ExitStack() as stack:
        yield AppServer(stack.enter_context(serve_in_thread(app)), app, settings, stack)


@pytest.mark.e2e
def test_view_route(tmp_path: Path) -> None:
    with view_server(tmp_path) as server:
        client = server.client()
        body = request_body(run_id="served-run", ops=["agent", "env"] * 6)
        assert client.post("/rollout", json=body).status_code == 200
        response = client.get("/runs/served-run/view")
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
        assert "Replay verified: all 6 decisions" in response.text
        assert len(page_data(response.text)["positions"]) == 7

        missing = client.get("/runs/no-such-run/view")
        assert error_body(missing, 404)["error"] == {
            "code": "not_found",
            "message": "no stored trace for run 'no-such-run'",
            "retryable": False,
            "run_id": "no-such-run",
        }
        assert server.client(key=None).get("/runs/served-run/view").status_code == 401
        assert server.client(key="wrong-key-000").get("/runs/served-run/view").status_code == 401


@pytest.mark.e2e
def test_view_route_without_tracing(tmp_path: Path) -> None:
    with view_server(tmp_path, tracing_enabled=False) as server:
        response = server.client().get("/runs/anything/view")
    assert "tracing is disabled" in error_body(response, 404, "not_found")["error"]["message"]


# --- in a browser ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def viewer_page(db: Path, worlds: WorldFactory, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pages") / "scripted-3.html"
    path.write_text(build_episode_page(run_from_trace(load_session(db, "scripted-3")), worlds).html, encoding="utf-8")
    return path


def _view_state(driver: Any) -> tuple[str, str, str, str]:
    by_id = lambda name: driver.find_element("id", name)  # noqa: E731
    return (by_id("frame").get_attribute("src"), by_id("counter").text, by_id("obs").text, by_id("actions").text)


@pytest.mark.e2e
def test_browser_steps_through_an_episode(chrome: Any, viewer_page: Path, tmp_path: Path) -> None:
    data = page_data(viewer_page.read_text())
    points, frames = data["positions"], data["frames"]
    chrome.get(viewer_page.as_uri())
    assert browser.console_errors(chrome) == []
    states = []
    for position in range(6):
        src, counter, obs, actions = _view_state(chrome)
        point = points[position]
        assert src == "data:image/png;base64," + frames[point["frame"]]
        assert counter == f"Decision {point['decision']} · {position + 1}/{len(points)}"
        assert obs == point["obs"] and obs.startswith("Step ")
        assert actions.split() == point["actions"]
        states.append((src, counter, obs))
        chrome.find_element("id", "next").click()
    assert len({state[0] for state in states}) > 1  # the frame changed with the counter and the text
    assert all(a[1] != b[1] and a[2] != b[2] for a, b in zip(states, states[1:], strict=False))

    slider = chrome.find_element("id", "slider")
    assert slider.get_attribute("max") == str(len(points) - 1)
    chrome.find_element("id", "last").click()
    assert _view_state(chrome)[1].startswith(f"After decision 59 · {len(points)}/{len(points)}")
    assert "Episode 0 over: the decision cap (60 per episode) was reached" in chrome.find_element("id", "kind").text

    chrome.find_element("id", "first").click()
    chrome.find_element("tag name", "body").send_keys("\ue014")  # ArrowRight
    assert _view_state(chrome)[1].startswith("Decision 1 ·")

    play = chrome.find_element("id", "play")
    play.click()
    wait_until(lambda: not _view_state(chrome)[1].startswith("Decision 1 ·"), timeout=5.0, interval=0.05)
    play.click()
    assert play.text == "▶ play"
    paused = _view_state(chrome)[1]
    time.sleep(0.5)
    assert _view_state(chrome)[1] == paused

    unlock = chrome.find_elements("css selector", "#timeline button")[2]
    target = int(unlock.get_attribute("data-pos"))
    unlock.click()
    assert _view_state(chrome)[1].startswith(f"Decision {points[target]['decision']} ·")
    assert chrome.find_element("id", "unlocked").text != "–"
    cursor = chrome.find_element("id", "vitals-cursor")
    assert float(cursor.get_attribute("x1")) > 18
    assert browser.console_errors(chrome) == []
    browser.screenshot(chrome, tmp_path / "viewer.png", "viewer.png")
    assert (tmp_path / "viewer.png").stat().st_size > 10_000
