"""The eval report: bootstrap interval, bars, model-call statistics, the episode pages it links, and the
report in headless Chromium."""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from support import browser
from support.pages import EXTERNAL, page_data
from support.policies import MODEL, FakeLLMPolicy
from support.rollouts import llm_rollout, make_plan, run_rollout

from task_app.game import ACHIEVEMENTS, Observation, WorldFactory
from task_app.inspection.report import (
    BOOTSTRAP_RESAMPLES,
    bootstrap_interval,
    call_samples,
    request_with_trace,
    write_report,
)
from task_app.inspection.scoring import EpisodeRow, crafter_score
from task_app.policy.base import HistoryEntry, PolicyDecision
from task_app.policy.scripted import ScriptedPolicy
from task_app.rollout.result import RolloutResult
from task_app.tracing import build_session_trace


def row_of(result: RolloutResult, *, with_trace: bool = False) -> EpisodeRow:
    """An EpisodeRow as `evaluation.run_rollouts` builds it from a response."""
    body = result.response(trace=build_session_trace(result) if with_trace else None)
    first = body["metrics"]["details"]["episodes"][0]
    return EpisodeRow(
        seed=result.plan.seed,
        run_id=result.plan.run_id,
        achievements=list(first["achievements"]),
        episode_return=float(first["return"]),
        decisions=int(body["metrics"]["num_steps"]),
        duration_s=0.5,
        stop_reason=body["metrics"]["details"]["stop_reason"],
        response=body,
    )


def scripted_rows(worlds: WorldFactory, seeds: Sequence[int], decisions: int) -> list[EpisodeRow]:
    rows = []
    for seed in seeds:
        plan = make_plan(
            run_id=f"eval-{seed}",
            env={"seed": seed},
            policy={"config": {"max_llm_calls": decisions}},
            ops=["agent", "env"] * decisions,
        )
        rows.append(
            row_of(run_rollout(plan, ScriptedPolicy(max_actions=8, seed=seed), worlds), with_trace=seed % 2 == 0)
        )
    return rows


class _MetaLLMPolicy(FakeLLMPolicy):
    """The fake chat model, with the step meta the react policy reports (model, latency, usage)."""

    async def decide(self, observation: Observation, history: Sequence[HistoryEntry]) -> PolicyDecision:
        decision = await super().decide(observation, history)
        assert decision.lm_call is not None
        decision.meta.update(model=MODEL, latency_ms=decision.lm_call.latency_ms, usage=decision.lm_call.usage)
        return decision


@pytest.fixture(scope="module")
def rows(worlds: WorldFactory) -> list[EpisodeRow]:
    return scripted_rows(worlds, (0, 1, 2, 3), 40)


@pytest.fixture(scope="module")
def report(rows: list[EpisodeRow], worlds: WorldFactory, tmp_path_factory: pytest.TempPathFactory) -> Any:
    failed = EpisodeRow(seed=9, run_id="eval-9", error="503: no capacity", duration_s=0.1)
    started = time.perf_counter()
    result = write_report([*rows, failed], tmp_path_factory.mktemp("report") / "out" / "report.html", worlds=worlds)
    assert time.perf_counter() - started < 20
    return result


# --- statistics -----------------------------------------------------------------------------------


def test_bootstrap_interval_is_seeded_and_brackets_the_score() -> None:
    episodes = [["collect_wood", "place_table"], ["collect_wood"], [], ["collect_wood", "eat_cow", "wake_up"]] * 3
    low, high = bootstrap_interval(episodes)
    assert bootstrap_interval(episodes) == (low, high)
    assert low <= crafter_score(episodes) <= high and low < high
    assert bootstrap_interval(episodes, seed=1) != (low, high)
    same = [["collect_wood"]] * 5
    assert bootstrap_interval(same) == (crafter_score(same), crafter_score(same))
    assert bootstrap_interval([]) == (0.0, 0.0)
    wide = bootstrap_interval(episodes[:4], resamples=BOOTSTRAP_RESAMPLES)
    assert wide[1] - wide[0] >= high - low  # fewer episodes, a wider interval


def test_request_with_trace() -> None:
    request = {"run_id": "r", "record": {"trajectories": True}}
    assert request_with_trace(request)["record"] == {
        "trajectories": True,
        "return_trace": True,
        "trace_format": "structured",
    }
    assert request == {"run_id": "r", "record": {"trajectories": True}}


def test_model_calls_are_summarised(worlds: WorldFactory, tmp_path: Path) -> None:
    rows = [
        row_of(llm_rollout(worlds, run_id=f"llm-{seed}", seed=seed, decisions=5, policy=_MetaLLMPolicy(seed=seed)))
        for seed in (1, 2)
    ]
    samples = call_samples(rows)
    assert len(samples["latency ms"]) == 10 and samples["prompt tokens"] == [812.0] * 10
    result = write_report(rows, tmp_path / "llm.html", worlds=worlds)
    page = result.path.read_text()
    assert '<table id="calls">' in page and "<td>prompt tokens</td><td>10</td><td>812</td>" in page
    assert "model fake-model-7b" in page and not result.replay_problems


# --- the page -------------------------------------------------------------------------------------


def test_report_page(report: Any, rows: list[EpisodeRow]) -> None:
    page = report.path.read_text(encoding="utf-8")
    assert EXTERNAL.search(page) is None
    bars = re.findall(r'class="rate-bar" data-achievement="(\w+)" data-rate="([\d.]+)"', page)
    assert sorted(name for name, _ in bars) == sorted(ACHIEVEMENTS)
    rates = dict(bars)
    assert float(rates["collect_wood"]) == 100.0
    assert f"{report.crafter_score:.1f}" in page and "95% CI" in page
    assert report.interval[0] <= report.crafter_score <= report.interval[1]
    assert "no model: every decision came from the scripted policy" in page
    assert "5 episode(s), 1 failed" in page and "503: no capacity" in page
    links = re.findall(r'class="episode-link" href="([^"]+)"', page)
    assert sorted(set(links)) == [f"episodes/eval-{seed}.html" for seed in range(4)]
    assert report.replay_problems == {}
    for row in rows:
        viewer = report.path.parent / "episodes" / f"{row.run_id}.html"
        assert report.pages[row.run_id] == viewer
        data = page_data(viewer.read_text(encoding="utf-8"))
        assert data["run_id"] == row.run_id and len(data["frames"]) > 10
        assert "Replay verified: all 40 decisions" in viewer.read_text()


def test_report_without_episode_pages(rows: list[EpisodeRow], tmp_path: Path) -> None:
    result = write_report(rows[:2], tmp_path / "r.html", episode_pages=False)
    assert result.pages == {} and not (tmp_path / "episodes").exists()
    assert 'class="episode-link"' not in result.path.read_text()


def test_report_notes_a_diverged_episode(rows: list[EpisodeRow], worlds: WorldFactory, tmp_path: Path) -> None:
    broken = copy.deepcopy(rows[1])
    broken.response["trajectories"][0]["steps"][2]["reward"] = 4.0  # type: ignore[index]
    result = write_report([broken], tmp_path / "r.html", worlds=worlds)
    assert result.replay_problems == {"eval-1": "diverged at decision 2 (reward)"}
    assert "diverged at decision 2 (reward)" in result.path.read_text()


# --- in a browser ---------------------------------------------------------------------------------


@pytest.mark.e2e
def test_browser_report_bars_and_links(chrome: Any, report: Any, tmp_path: Path) -> None:
    chrome.get(report.path.as_uri())
    assert browser.console_errors(chrome) == []
    bars = chrome.find_elements("css selector", "#rates .rate-bar")
    assert len(bars) == len(ACHIEVEMENTS)
    track = chrome.find_element("css selector", "#rates .track").size["width"]
    for bar in bars:
        expected = float(bar.get_attribute("data-rate")) / 100 * track
        assert abs(bar.size["width"] - expected) <= 2
    assert bars[0].size["width"] > 0  # sorted by rate: the first bar is the most successful achievement
    assert len(chrome.find_elements("css selector", "#histogram .hist-bar")) >= 1
    browser.screenshot(chrome, tmp_path / "report.png", "report.png")

    link = chrome.find_elements("css selector", "#per-episode a.episode-link")[1]
    link.click()
    assert chrome.current_url.endswith("/episodes/eval-1.html")
    assert "eval-1" in chrome.title
    assert chrome.find_element("id", "frame").get_attribute("src").startswith("data:image/png;base64,")
    assert chrome.find_element("id", "counter").text.startswith("Decision 0 ·")
    assert browser.console_errors(chrome) == []
    chrome.back()
    table_links = chrome.find_elements("css selector", "#episodes a.episode-link")
    assert [item.text for item in table_links] == [f"eval-{seed}" for seed in range(4)]
