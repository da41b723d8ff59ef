"""Rubrics: the shipped files are valid; a broken one stops start-up naming the file and the field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from task_app.core.rubrics import RUBRIC_FILES, RubricError, load_rubric, load_rubrics, packaged_rubrics
from task_app.core.settings import Settings
from task_app.web.server import create_app


def _copy_rubrics(tmp_path: Path) -> Path:
    target = tmp_path / "rubrics"
    shutil.copytree(str(packaged_rubrics()), target)
    return target


def test_shipped_rubrics_load() -> None:
    rubrics = load_rubrics(None)
    assert [criterion.id for criterion in rubrics["outcome"].criteria] == [
        "achievement_progression",
        "resource_stockpile",
        "survival_state",
        "failure_analysis",
        "future_readiness",
    ]
    assert [criterion.weight for criterion in rubrics["events"].criteria] == [0.55, 0.2, 0.15, 0.1]
    assert {rubric.aggregation for rubric in rubrics.values()} == {"weighted_sum"}


def test_missing_file_is_named(tmp_path: Path) -> None:
    directory = _copy_rubrics(tmp_path)
    (directory / RUBRIC_FILES["events"]).unlink()
    with pytest.raises(RubricError, match=r"crafter_events_rubric\.json: rubric file not found"):
        load_rubrics(directory)


def test_invalid_json_is_named(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"version": "1", "criteria": [')
    with pytest.raises(RubricError, match=r"broken\.json: not valid JSON"):
        load_rubric(path)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda rubric: rubric["criteria"][1].update(weight=-1), r"field criteria\.1\.weight"),
        (lambda rubric: rubric.pop("version"), r"field version"),
        (lambda rubric: rubric.update(aggregation="median"), r"field aggregation"),
        (lambda rubric: rubric["criteria"].append(dict(rubric["criteria"][0])), r"duplicate criterion ids"),
        (lambda rubric: rubric.update(judge="gpt"), r"field judge"),
    ],
)
def test_bad_field_is_named(tmp_path: Path, change, field: str) -> None:
    directory = _copy_rubrics(tmp_path)
    path = directory / RUBRIC_FILES["outcome"]
    rubric = json.loads(path.read_text())
    change(rubric)
    path.write_text(json.dumps(rubric))
    with pytest.raises(RubricError, match=rf"crafter_outcome_rubric\.json: .*{field}"):
        load_rubric(path)


@pytest.mark.anyio
async def test_broken_rubric_stops_start_up(tmp_path: Path) -> None:
    directory = _copy_rubrics(tmp_path)
    path = directory / RUBRIC_FILES["events"]
    rubric = json.loads(path.read_text())
    rubric["criteria"][0]["weight"] = 0
    path.write_text(json.dumps(rubric))
    app = create_app(Settings(rubrics_dir=directory, traces_db=tmp_path / "t.db", warm_up=False))
    with pytest.raises(RubricError, match=r"crafter_events_rubric\.json: field criteria\.0\.weight"):
        async with app.router.lifespan_context(app):
            pass
