"""Every Python block of docs/client.md runs as written against a live app (TASK_APP_URL and
ENVIRONMENT_API_KEY set, as the page says)."""

from __future__ import annotations

import re

import pytest
from conftest import KEY, REPO, App

pytestmark = pytest.mark.e2e

PAGE = REPO / "docs" / "client.md"
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)


def test_the_page_has_examples() -> None:
    assert len(BLOCKS) >= 10


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_the_example_runs(index: int, app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASK_APP_URL", app.base_url)
    monkeypatch.setenv("ENVIRONMENT_API_KEY", KEY)
    exec(compile(BLOCKS[index], f"docs/client.md block {index + 1}", "exec"), {"__name__": "__main__"})
