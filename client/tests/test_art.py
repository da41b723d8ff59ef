"""ART with the real openpipe-art 0.5.23 (the `.ci/adapters-art` virtualenv, Python 3.12): the rollout
function of docs/trainers/art.md, run as written against a live app and the loopback fake model
(which calls `interact_many(move_left, do)`), builds real `art.Trajectory` groups."""

from __future__ import annotations

import re

import pytest
from conftest import KEY, REPO, App, FakeModelProcess, trainer_library

pytestmark = pytest.mark.e2e
art = trainer_library("art")

PAGE = REPO / "docs" / "trainers" / "art.md"
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)


def test_the_pages_rollout_builds_trajectory_groups(
    app: App, fake_model: FakeModelProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TASK_APP_URL", app.base_url)
    monkeypatch.setenv("ENVIRONMENT_API_KEY", KEY)
    monkeypatch.setenv("INFERENCE_BASE_URL", fake_model.url("/v1"))
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert len(BLOCKS) == 2
    namespace: dict[str, object] = {"__name__": "__main__"}
    for index, block in enumerate(BLOCKS):
        exec(compile(block, f"docs/trainers/art.md block {index + 1}", "exec"), namespace)
    groups = namespace["groups"]
    assert isinstance(groups, list) and len(groups) == 2
    for group in groups:
        assert isinstance(group, art.TrajectoryGroup)
        assert len(group.trajectories) == 2
        for trajectory in group.trajectories:
            assert isinstance(trajectory, art.Trajectory)
            assert trajectory.metrics["env_steps"] == 6  # 3 turns of [move_left, do]
            assert trajectory.metadata["task_id"] in ("crafter/train/0", "crafter/train/1")
            roles = [item["role"] if isinstance(item, dict) else "choice" for item in trajectory.messages_and_choices]
            assert roles[:2] == ["system", "user"] and roles.count("choice") == 3 and roles.count("tool") == 3
            assert isinstance(trajectory.reward, float)
