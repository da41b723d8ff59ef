"""The `e2e` marker is enforced (support/e2e.py): a child pytest session with the suite's conftest runs
tests that start servers and child processes with and without the marker, and reports each outcome."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.processes import ROOT, child_environment

pytestmark = pytest.mark.e2e  # it runs pytest in a child process

SAMPLE = """
import socket
import subprocess
import sys
import threading

import pytest


def _listen():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()


@pytest.fixture(scope="module")
def own_server():
    _listen()
    return "listened"


def test_plain():
    assert 1 + 1 == 2


def test_listens():
    _listen()


def test_starts_a_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_listens_in_a_thread_that_swallows_the_error():
    def serve():
        try:
            _listen()
        except Exception:
            pass

    thread = threading.Thread(target=serve)
    thread.start()
    thread.join()


def test_uses_the_app_server(client):
    pass


def test_uses_the_fake_model(fake_model):
    pass


@pytest.mark.e2e
def test_marked_listens():
    _listen()


@pytest.mark.e2e
def test_marked_starts_a_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


@pytest.mark.e2e
def test_marked_uses_a_module_server(own_server):
    assert own_server == "listened"


def test_then_unmarked_uses_the_same_module_server(own_server):
    pass
"""

WHOLE_MODULE = """
import pytest
import a_module_that_does_not_exist  # never imported under -m "not e2e"

pytestmark = pytest.mark.e2e


def test_never_collected_in_the_fast_part():
    pass
"""


def _outcomes(directory: Path, *options: str) -> dict[str, str]:
    """{test name: "passed" | "failed"} of a child pytest session with the suite's conftest (failed: it
    failed or errored, at setup, call or teardown)."""
    environment = child_environment()
    environment["PYTHONPATH"] = str(ROOT / "tests")
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q", "-rA"]
        + ["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(directory), *options, str(directory)],
        cwd=directory,
        env=environment,
        capture_output=True,
        text=True,
        timeout=240,
    )
    outcomes: dict[str, str] = {}
    for line in completed.stdout.splitlines():
        found = re.match(r"(PASSED|FAILED|ERROR) \S+::(\w+)", line)
        if found:  # a test that fails and then errors at teardown is reported twice
            failed = found.group(1) != "PASSED" or outcomes.get(found.group(2)) == "failed"
            outcomes[found.group(2)] = "failed" if failed else "passed"
    assert outcomes, completed.stdout + completed.stderr
    return outcomes


def test_a_test_that_starts_a_server_or_a_process_without_the_marker_fails(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(SAMPLE, encoding="utf-8")
    outcomes = _outcomes(tmp_path)
    assert outcomes == {
        "test_plain": "passed",
        "test_listens": "failed",
        "test_starts_a_process": "failed",
        "test_listens_in_a_thread_that_swallows_the_error": "failed",  # the teardown check catches it
        "test_uses_the_app_server": "failed",  # fails at setup, before the server starts
        "test_uses_the_fake_model": "failed",
        "test_marked_listens": "passed",
        "test_marked_starts_a_process": "passed",
        "test_marked_uses_a_module_server": "passed",
        "test_then_unmarked_uses_the_same_module_server": "failed",  # the fixture was seen to listen
    }


def test_the_fast_part_leaves_a_marked_module_out_without_importing_it(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(SAMPLE, encoding="utf-8")
    (tmp_path / "test_whole.py").write_text(WHOLE_MODULE, encoding="utf-8")
    outcomes = _outcomes(tmp_path, "-m", "not e2e")
    assert "test_never_collected_in_the_fast_part" not in outcomes
    assert outcomes["test_plain"] == "passed" and outcomes["test_listens"] == "failed"
    assert not any(name.startswith("test_marked") for name in outcomes)
