"""Every shell and Python example of README.md and docs/, run as a reader would run it.

Each ```bash / ```sh / ```console / ```python block is one test, run in a child process against a
live task app (real uvicorn on 127.0.0.1, its traces in ./traces/task_app.db of the directory the
examples run in, as `task-app serve` keeps them) and the loopback fake model, with the variables the
docs tell readers to set: TASK_APP_URL and ENVIRONMENT_API_KEY. The docs' model server,
http://127.0.0.1:8000 (and the callback receiver at :9000), is the fake model's address here.

Shell blocks run under `bash -eu` with `curl` failing on an HTTP error status or a connection error,
anywhere in a pipeline or a `$(...)`, so an example that gets a 4xx fails here though a reader's
`curl -s` would only print the error (a pipe that `head` closes early is no failure). A block
that cannot run here (Modal, a server that runs forever, an install) is preceded by
`<!-- not run: reason -->`, which the page does not show. A Python block that imports a client this
virtualenv does not have (`openenv` lives in the `openenv` extra, not in `dev`) is skipped, naming it:
run this file in a virtualenv with that extra to cover it.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from support.fake_model import FakeModel, tool_call
from support.keys import TEST_KEY
from support.processes import ROOT
from support.servers import AppServer, start_app_server

pytestmark = pytest.mark.e2e

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LANGUAGES = {"bash": "shell", "sh": "shell", "console": "console", "python": "python"}
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.S | re.M)
NOT_RUN = re.compile(r"<!--\s*not run:\s*(?P<reason>\S.*?)\s*-->\s*$")
MODEL_URLS = ("http://127.0.0.1:8000", "http://127.0.0.1:9000")
BLOCK_TIMEOUT_S = 240
# Runs the examples name as a reader's own (e.g. `task-app traces show try-1`, after Getting started).
KNOWN_RUNS = {
    "try-1": {
        "mode": "eval",
        "env": {"env_name": "crafter", "seed": 3},
        "policy": {"policy_name": "crafter-scripted", "config": {"max_llm_calls": 50}},
        "ops": ["agent", "env"],
    }
}
# Shell prelude: a failed curl (an HTTP error status, no connection; not the write error of a pipe that
# `head` closed) ends the whole example, from inside a pipeline or a command substitution too.
CURL_FAILS = """trap 'exit 97' USR1
curl() { command curl --fail-with-body --show-error "$@" || { s=$?; [ "$s" = 23 ] || kill -USR1 $$; return "$s"; }; }
"""


@dataclass(frozen=True)
class Example:
    page: Path
    line: int
    kind: str  # "shell" | "console" | "python"
    code: str
    skipped: str | None  # the `not run` reason

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def examples(page: Path) -> list[Example]:
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        kind = LANGUAGES.get(match["lang"])
        if kind is None:
            continue
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        reason = NOT_RUN.search(before)
        line = text.count("\n", 0, match.start()) + 1
        code = textwrap.dedent(match["body"])
        found.append(Example(page, line, kind, code, reason["reason"] if reason else None))
    return found


ALL = [example for page in PAGES for example in examples(page)]


def test_the_pages_have_examples_and_say_why_one_is_not_run() -> None:
    """The extraction cannot pass by finding nothing, and every skipped block names its reason."""
    ran = [example for example in ALL if example.skipped is None]
    assert len(ran) >= 20 and {example.kind for example in ran} >= {"shell", "python"}
    assert {example.page.name for example in ran} >= {"README.md", "getting-started.md", "sessions.md"}
    on_modal = examples(ROOT / "docs" / "modal.md")
    assert on_modal and all(example.skipped for example in on_modal)


def test_every_relative_link_of_the_readme_resolves() -> None:
    """mkdocs --strict checks the site's links; the README is read on GitHub and PyPI, so here."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\((?!https?://|#)([^)#\s]+)", text)
    assert targets
    assert [target for target in targets if not (ROOT / target).exists()] == []


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("reader")


@pytest.fixture(scope="module")
def live_app(workdir: Path) -> Iterator[AppServer]:
    """The app as a reader runs it: traces in ./traces/task_app.db of the examples' directory."""
    with ExitStack() as stack:
        server = start_app_server(stack, workdir, traces_db=workdir / "traces" / "task_app.db")
        with httpx.Client(base_url=server.base_url, headers={"X-API-Key": TEST_KEY}, timeout=60) as client:
            for run_id, body in KNOWN_RUNS.items():
                client.post("/rollout", json={"run_id": run_id, **body}).raise_for_status()
        yield server


def _environment(app: AppServer) -> dict[str, str]:
    env = dict(os.environ)  # conftest's clean_environ has taken the developer's keys and settings out
    env.update(
        TASK_APP_URL=app.base_url,
        ENVIRONMENT_API_KEY=TEST_KEY,
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),  # task-app, python
        NO_PROXY="127.0.0.1,localhost",
        PYTHONUNBUFFERED="1",
    )
    return env


def _missing_imports(code: str) -> list[str]:
    """The top-level modules a Python example imports that this interpreter cannot find."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return sorted(name for name in names if importlib.util.find_spec(name) is None)


def _console_commands(code: str) -> str:
    """The commands of a console transcript: `$ ` lines and their `\\` continuations; output dropped."""
    commands: list[str] = []
    continued = False
    for line in code.splitlines():
        if continued or line.startswith("$ "):
            commands.append(line if continued else line[2:])
            continued = line.endswith("\\")
    return "\n".join(commands) + "\n"


@pytest.mark.parametrize("example", ALL, ids=[example.name for example in ALL])
def test_the_example_runs(example: Example, live_app: AppServer, fake_model: FakeModel, workdir: Path) -> None:
    if example.skipped:
        pytest.skip(f"not run: {example.skipped}")
    code = example.code
    for url in MODEL_URLS:
        code = code.replace(url, fake_model.base_url)
    fake_model.default = tool_call("move_left", "do")
    fake_model.tokens = "vllm"
    fake_model.template = "reasoning"  # a chat template, as a real server renders one (episode sequences hold)
    if example.kind == "python":
        if missing := _missing_imports(code):
            pytest.skip(f"needs {', '.join(missing)}, not installed in this virtualenv")
        command = [sys.executable, "-c", code]
    else:
        script = code if example.kind == "shell" else _console_commands(code)
        command = ["bash", "-eu", "-c", CURL_FAILS + script]
    done = subprocess.run(
        command,
        cwd=workdir,
        env=_environment(live_app),
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
        check=False,
    )
    output = f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, f"{example.name} failed ({done.returncode}):\n{output}"
    if MODEL_URLS[0] in example.code:
        assert fake_model.requests, f"{example.name} names the model server but never called it"
