"""`task-app eval --repeats K`: mean ± standard error over seeds, the Crafter score with its seed-resampled
interval, BALROG's progression, pass@k per achievement, the share of invalid actions, and the `--json` file;
hand-computed figures, then the command against a served app.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from support.fake_model import FakeModel, tool_call
from support.keys import TEST_KEY
from support.servers import AppServer

from task_app.cli.main import main
from task_app.inspection.eval_stats import eval_summary, mean_se, pass_at_k
from task_app.inspection.report import write_report
from task_app.inspection.scoring import EpisodeRow, crafter_score


def test_mean_and_standard_error() -> None:
    figure = mean_se([1.0, 2.0, 3.0])
    assert (figure.mean, figure.n) == (2.0, 3) and figure.se == pytest.approx(1 / math.sqrt(3))
    assert mean_se([4.0]).se is None and mean_se([None, 4.0]).mean == 4.0
    assert mean_se([]).mean is None
    assert mean_se([1.0, 3.0]).text() == "2.00 ± 1.00"


def test_pass_at_k() -> None:
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3, 2) / C(4, 2)
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 3, 3) == 1.0
    with pytest.raises(ValueError, match="pass@3 needs at least 3 attempts"):
        pass_at_k(2, 1, 3)


def row(
    seed: int,
    repeat: int,
    achievements: list[str],
    outcome: float | None = None,
    events: float | None = None,
    rejected: int = 0,
    error: str | None = None,
) -> EpisodeRow:
    return EpisodeRow(
        seed=seed,
        run_id=f"r{seed}-{repeat}",
        repeat=repeat,
        achievements=achievements,
        episode_return=float(len(achievements)),
        outcome_score=outcome,
        events_score=events,
        proposed_actions=10,
        rejected_actions=rejected,
        error=error,
    )


def test_the_figures_over_seeds_and_repeats() -> None:
    rows = [
        row(0, 0, ["collect_wood", "place_table"], 0.4, 0.2, rejected=1),
        row(0, 1, ["collect_wood"], 0.2, 0.1),
        row(1, 0, ["collect_wood", "collect_sapling", "place_plant", "eat_cow"], 0.6, 0.3),
        row(1, 1, [], rejected=3),
        row(2, 0, ["collect_wood"], error="502: model down"),
    ]
    summary = eval_summary(rows, repeats=2)
    assert (summary["seeds"], summary["episodes"], summary["failed"]) == (2, 4, 1)
    # per seed: achievements 1.5 and 2.0; return the same; outcome 0.3 and 0.6 (a missing score is skipped)
    assert summary["achievements_per_episode"] == {"mean": 1.75, "se": pytest.approx(0.25), "n": 2}
    assert summary["return"]["mean"] == 1.75
    assert summary["outcome_score"]["mean"] == pytest.approx(0.45) and summary["outcome_score"]["se"] == pytest.approx(
        0.15
    )
    assert summary["events_score"]["mean"] == pytest.approx(0.225)
    assert summary["balrog_progression"]["mean"] == pytest.approx(100 * 1.75 / 22)
    episodes = [r.achievements for r in rows if r.error is None]
    assert summary["crafter_score"]["score"] == crafter_score(episodes)
    low, high = summary["crafter_score"]["ci95"]
    assert low <= summary["crafter_score"]["score"] <= high and summary["crafter_score"]["resampled"] == "seeds"
    assert summary["invalid_action_share"] == pytest.approx(4 / 40)
    wood, table = summary["pass_at_k"]["collect_wood"], summary["pass_at_k"]["place_table"]
    assert wood == {"pass@1": 0.75, "pass@2": 1.0}  # seed 0: 2 of 2, seed 1: 1 of 2
    assert table == {"pass@1": 0.25, "pass@2": 0.5}
    assert summary["success_rates"]["collect_wood"] == 75.0
    assert [item["seed"] for item in summary["per_seed"]] == [0, 1]
    json.dumps(summary)  # the --json file


@pytest.mark.e2e
def test_eval_repeats_end_to_end(app_server: AppServer, fake_model: FakeModel, tmp_path: Path) -> None:
    fake_model.default = tool_call("move_left", "do", "fly")  # one invalid action per decision
    out = tmp_path / "eval.json"
    code = main(
        [
            "eval",
            "--base-url",
            app_server.base_url,
            "--api-key",
            TEST_KEY,
            "--inference-url",
            fake_model.url(),
            "--model",
            "fake-model",
            "--seeds",
            "0-2",
            "--repeats",
            "2",
            "--decisions",
            "3",
            "--concurrency",
            "3",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    summary = json.loads(out.read_text())
    assert (summary["seeds"], summary["repeats"], summary["episodes"], summary["failed"]) == (3, 2, 6, 0)
    assert len(fake_model.requests) == 18  # 3 seeds x 2 repeats x 3 decisions
    assert summary["invalid_action_share"] == pytest.approx(1 / 3)  # move_left, do ran; fly was rejected
    assert summary["actions"] == {"proposed": 54, "rejected": 18}
    for name in ("achievements_per_episode", "return", "outcome_score", "events_score", "balrog_progression"):
        assert summary[name]["n"] == 3 and summary[name]["se"] is not None
    assert 0 < summary["outcome_score"]["mean"] <= 1
    # the same answers every time: each seed's two rollouts are identical, so pass@2 equals pass@1
    for values in summary["pass_at_k"].values():
        assert values["pass@1"] == values["pass@2"]


def test_repeats_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["eval", "--base-url", "x", "--api-key", "k", "--inference-url", "x", "--model", "m", "--repeats", "0"])
    assert "0 is below 1" in capsys.readouterr().err


def test_the_report_shows_both_rubric_scores(tmp_path: Path) -> None:
    rows = [row(0, 0, ["collect_wood"], 0.2, 0.1), row(1, 0, [], 0.4, None), row(2, 0, [], 0.9, 0.9, error="500")]
    page = write_report(rows, tmp_path / "report.html", episode_pages=False).path.read_text()
    assert 'Outcome score</div><div class="big">0.300</div>' in page  # the failed rollout is not scored
    assert 'Events score</div><div class="big">0.100</div>' in page
    assert "the outcome rubric, mean of 2 episode(s)" in page and "the events rubric, mean of 1 episode(s)" in page
