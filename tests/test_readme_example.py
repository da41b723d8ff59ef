"""The README's trainer-side example, run as written against a real server and the loopback fake model."""

from __future__ import annotations

import re
from typing import Any

import pytest
from support.fake_model import FakeModel, tool_call
from support.keys import TEST_KEY
from support.processes import ROOT
from support.servers import AppServer

pytestmark = pytest.mark.e2e  # every test here starts a server or a child process


def test_the_trainer_loop_in_the_readme_runs(app_server: AppServer, fake_model: FakeModel) -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Environment sessions") :]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    source = (
        code.group(1)
        .replace('"http://127.0.0.1:8001"', repr(app_server.base_url))
        .replace('"http://127.0.0.1:8000/v1"', repr(fake_model.url("/v1")))
        .replace('KEY = "..."', f"KEY = {TEST_KEY!r}")
    )
    fake_model.default = tool_call("move_left", "do")
    namespace: dict[str, Any] = {}
    try:
        exec(compile(source, "README.md", "exec"), namespace)  # the README's own code, nothing else
        returns = namespace["returns"]
        assert len(returns) == 2 and all(isinstance(value, float) for value in returns.values())
        assert len(fake_model.requests) >= 20 + 2  # the model decided every step (episodes may end early)
        for env_id in returns:
            answer = namespace["app"].post("/step", json={"env_id": env_id, "tool_calls": []}).json()
            assert answer["error"]["code"] == "env_not_found"  # the example terminated its branches
    finally:
        for name in ("app", "model"):
            if name in namespace:
                namespace[name].close()
