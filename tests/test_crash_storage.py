"""Crashes and storage trouble, with the server as a real process where it matters.

- SIGKILL of a server process in the middle of 16 concurrent rollouts, then a restart on the same
  database: it passes `PRAGMA integrity_check` and holds, complete, every rollout that was answered.
- SIGKILL in the middle of a rollout whose rows were going to disk as it ran: no reader sees a session
  for it, and the trainer's retry of the same run_id replaces those rows.
- A trace database that turns read-only or full while the server runs (SQLite's own errors, forced
  through the server's connection): the rollout still succeeds, `metrics.details.storage` says
  `stored: false`, `/health` says `degraded`, and both recover once the disk does.
- The same with a real disk, where the machine allows mount namespaces (root; skipped otherwise): a
  read-only bind mount, and a 2 MB tmpfs that the test fills up and then frees.

`server_process` (support/processes.py) runs the app as a child process; its log is checked for key material
when it stops.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import sqlite3
import subprocess
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.fake_model import FakeModel, delay, tool_call
from support.polling import wait_until
from support.processes import server_process
from support.rollouts import request_body
from support.servers import AppServer

from task_app.core.contracts import RolloutResponse
from task_app.tracing import TraceReader, TraceStore

pytestmark = [pytest.mark.usefixtures("no_key_in_logs"), pytest.mark.e2e]

WAIT_S = 20.0


def namespaces_available() -> bool:
    """Whether this machine lets us mount inside a private mount namespace (root in a container does)."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True, check=False
    )
    return probe.returncode == 0


needs_namespaces = pytest.mark.skipif(not namespaces_available(), reason="needs mount namespaces (root)")


# --- helpers ----------------------------------------------------------------------------------------


def storage_of(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    result = RolloutResponse.model_validate(response.json())
    assert result.metrics.details["stop_reason"] == "completed"
    storage: dict[str, Any] = result.metrics.details["storage"]["trace"]
    return storage


def db_rows(path: str | Path) -> dict[str, int]:
    """Timesteps per stored session, read-only."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        sessions = {row[0]: 0 for row in conn.execute("SELECT session_id FROM session_traces")}
        for session_id, steps in conn.execute("SELECT session_id, COUNT(*) FROM session_timesteps GROUP BY 1"):
            sessions[session_id] = steps
    return sessions


# --- SIGKILL during 16 concurrent rollouts --------------------------------------------------------


def test_sigkill_during_16_rollouts_loses_no_answered_rollout(tmp_path: Path, fake_model: FakeModel) -> None:
    db = tmp_path / "traces" / "traces.db"
    fake_model.default = delay(0.02, tool_call("move_left", "do"))  # ~25 ms per decision
    decisions = [4 + 8 * index for index in range(16)]  # 0.1 s ... 3 s of model time
    bodies = [request_body(inference_url=fake_model.url(), decisions=count, env={"seed": 3}) for count in decisions]
    answered: dict[str, int] = {}
    lock = threading.Lock()

    with server_process(tmp_path, traces_db=db, max_concurrent_rollouts=32) as first:

        def post(body: dict[str, Any]) -> None:
            with first.client(timeout=WAIT_S) as client:
                response = client.post("/rollout", json=body)
            result = RolloutResponse.model_validate(response.json())
            assert result.metrics.details["storage"]["trace"] == {"stored": True}
            with lock:
                answered[body["run_id"]] = result.metrics.num_steps

        with ThreadPoolExecutor(max_workers=16) as pool:
            futures: list[Future[None]] = [pool.submit(post, body) for body in bodies]
            wait_until(lambda: len(answered) >= 5, timeout=WAIT_S)
            assert first.health()["rollouts"]["active"] >= 4  # the kill lands in the middle of the others
            first.kill()
            errors = [future.exception(timeout=WAIT_S) for future in futures]
        assert first.process.returncode == -signal.SIGKILL
    failed = [error for error in errors if error is not None]
    assert all(isinstance(error, httpx.TransportError) for error in failed), failed  # only the killed ones
    assert 5 <= len(answered) < 16

    stored = db_rows(db)  # before any restart: what the killed process left on disk
    for run_id, steps in answered.items():
        assert stored.get(run_id) == steps, (run_id, steps, stored.get(run_id))

    with server_process(tmp_path, traces_db=db) as second:
        health = second.health()
        assert health["storage"]["status"] == "ok"
        with second.client() as client:
            again = request_body(inference_url=fake_model.url(), decisions=3, env={"seed": 3})
            assert storage_of(client.post("/rollout", json=again)) == {"stored": True}
    after = db_rows(db)
    assert after[again["run_id"]] == 3
    assert {run_id: after[run_id] for run_id in answered} == answered


def _parts_on_disk(path: Path, run_id: str) -> tuple[int, bool]:
    """(timesteps stored for `run_id`, whether its session row is there), read-only."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        (steps,) = conn.execute("SELECT COUNT(*) FROM session_timesteps WHERE session_id = ?", (run_id,)).fetchone()
        (sessions,) = conn.execute("SELECT COUNT(*) FROM session_traces WHERE session_id = ?", (run_id,)).fetchone()
    return steps, bool(sessions)


def test_a_rollout_killed_midway_stays_invisible_and_its_rerun_replaces_its_parts(
    tmp_path: Path, fake_model: FakeModel
) -> None:
    db = tmp_path / "traces" / "traces.db"
    fake_model.default = delay(0.3, tool_call("move_left", "do"))  # parts go to disk every ~2 decisions
    body = request_body(inference_url=fake_model.url(), decisions=60, env={"seed": 3})
    run_id = body["run_id"]
    with server_process(tmp_path, traces_db=db) as first, ThreadPoolExecutor(max_workers=1) as pool:

        def post() -> httpx.Response:
            with first.client(timeout=WAIT_S) as client:
                return client.post("/rollout", json=body)

        future = pool.submit(post)
        wait_until(lambda: db.exists() and _parts_on_disk(db, run_id)[0] >= 2, timeout=WAIT_S)
        first.kill()
        assert isinstance(future.exception(timeout=WAIT_S), httpx.TransportError)
    steps, has_session = _parts_on_disk(db, run_id)
    assert steps >= 2 and not has_session  # on disk, but not a session

    async def read() -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        async with TraceReader(db) as reader:
            return await reader.get_session(run_id), await reader.list_sessions()

    assert asyncio.run(read()) == (None, [])
    fake_model.default = tool_call("move_left", "do")
    with server_process(tmp_path, traces_db=db) as second, second.client() as client:
        again = request_body(inference_url=fake_model.url(), decisions=3, env={"seed": 3}, run_id=run_id)
        assert storage_of(client.post("/rollout", json=again)) == {"stored": True}  # the trainer's retry
    assert _parts_on_disk(db, run_id) == (3, True)  # the killed run's parts replaced, not merged
    assert db_rows(db) == {run_id: 3}


# --- read-only and full, forced through the server's own connection ------------------------------


def _on_server_loop(server: AppServer, sql: str) -> None:
    """Run one statement on the trace store's writing connection, in its thread, between writes."""
    store = server.state.recorder.store
    assert store is not None
    writer = store.writer
    assert writer._task is not None and writer._conn is not None
    conn = writer._conn

    async def run() -> None:
        await writer._in_thread(lambda: conn.execute(sql))

    asyncio.run_coroutine_threadsafe(run(), writer._task.get_loop()).result(timeout=WAIT_S)


@pytest.mark.parametrize(
    ("fail", "recover", "error"),
    [
        ("PRAGMA query_only = 1", "PRAGMA query_only = 0", "readonly"),
        ("PRAGMA max_page_count = 1", "PRAGMA max_page_count = 1073741823", "full"),
    ],
    ids=["read-only", "full"],
)
def test_storage_failure_degrades_visibly_and_recovers(
    make_app_server: Callable[..., AppServer], fake_model: FakeModel, fail: str, recover: str, error: str
) -> None:
    server = make_app_server(warm_up=False)
    client = server.client()
    assert storage_of(
        client.post("/rollout", json=request_body(inference_url=fake_model.url(), decisions=2, env={"seed": 3}))
    ) == {"stored": True}
    assert server.health()["storage"]["status"] == "ok"

    _on_server_loop(server, "VACUUM")  # no free pages (migration 3's dropped indexes leave some) for a write to reuse
    _on_server_loop(server, fail)
    storage = storage_of(
        client.post("/rollout", json=request_body(inference_url=fake_model.url(), decisions=2, env={"seed": 3}))
    )  # the rollout still succeeds
    assert storage["stored"] is False and error in storage["error"]
    health = server.health()
    assert health["healthy"] is True  # still serving: storage trouble is not unreadiness
    assert health["storage"]["status"] == "degraded" and error in health["storage"]["last_error"]
    assert storage_of(client.post("/rollout", json=request_body(run_id=f"s-{uuid.uuid4().hex}")))["stored"] is False

    _on_server_loop(server, recover)
    assert storage_of(
        client.post("/rollout", json=request_body(inference_url=fake_model.url(), decisions=2, env={"seed": 3}))
    ) == {"stored": True}
    health = server.health()["storage"]
    assert health["status"] == "ok" and health["failures"] == 2 and health["written"] == 2


def test_an_unwritable_trace_location_degrades_from_the_start(
    make_app_server: Callable[..., AppServer], tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the traces directory should be")
    server = make_app_server(traces_db=blocker / "traces.db", warm_up=False)
    health = server.health()
    assert health["healthy"] is True and health["storage"]["status"] == "degraded"
    storage = storage_of(server.client().post("/rollout", json=request_body(run_id="unwritable-1")))
    assert storage["stored"] is False and storage["error"]


# --- the same with a real disk (mount namespaces) ------------------------------------------------


def _prepared_database(path: Path) -> None:
    async def create() -> None:
        async with TraceStore(path):
            pass

    asyncio.run(create())


@needs_namespaces
def test_a_read_only_volume(tmp_path: Path, fake_model: FakeModel) -> None:
    """An existing trace database on a volume mounted read-only (the server's view only)."""
    volume = tmp_path / "volume"
    volume.mkdir()
    _prepared_database(volume / "traces.db")
    read_only = [
        "unshare",
        "-m",
        "sh",
        "-c",
        'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" && exec "$@"',
        str(volume),
    ]
    with server_process(tmp_path, prefix=read_only, traces_db=volume / "traces.db") as server:
        health = server.health()
        assert health["healthy"] is True and health["storage"]["status"] == "degraded"
        with server.client() as client:
            storage = storage_of(
                client.post("/rollout", json=request_body(inference_url=fake_model.url(), decisions=2, env={"seed": 3}))
            )
        assert storage["stored"] is False and storage["error"]
        assert server.health()["storage"]["status"] == "degraded"
    assert db_rows(volume / "traces.db") == {}  # nothing was written behind the mount's back


@needs_namespaces
def test_a_full_disk_and_its_recovery(tmp_path: Path, fake_model: FakeModel) -> None:
    """The traces live on a 2 MB tmpfs; the test fills it up (ENOSPC), then frees it."""
    volume = tmp_path / "volume"
    volume.mkdir()
    small_disk = ["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=2m tmpfs "$0" && exec "$@"', str(volume)]
    with server_process(tmp_path, prefix=small_disk, traces_db=volume / "traces.db") as server:
        seen = Path(f"/proc/{server.pid}/root") / volume.relative_to("/")  # the tmpfs, as the server sees it
        with server.client() as client:
            assert storage_of(
                client.post("/rollout", json=request_body(inference_url=fake_model.url(), decisions=2, env={"seed": 3}))
            ) == {"stored": True}
            filler = seen / "filler"
            with filler.open("wb", buffering=0) as handle, suppress(OSError):  # unbuffered: close has nothing to flush
                while True:
                    handle.write(b"\0" * 65536)
            storage = storage_of(
                client.post("/rollout", json=request_body(inference_url=fake_model.url(), decisions=8, env={"seed": 3}))
            )
            assert storage["stored"] is False and "full" in storage["error"]
            assert server.health()["storage"]["status"] == "degraded"

            filler.unlink()
            recovered = request_body(inference_url=fake_model.url(), decisions=2, env={"seed": 3})
            assert storage_of(client.post("/rollout", json=recovered)) == {"stored": True}
            assert server.health()["storage"]["status"] == "ok"
            # SQLite resolves /proc/<pid>/root to our own root: read a copy (the server is idle now)
            copy = tmp_path / "copy"
            copy.mkdir()
            for name in ("traces.db", "traces.db-wal"):
                shutil.copyfile(seen / name, copy / name)
            rows = db_rows(copy / "traces.db")
        assert rows[recovered["run_id"]] == 2 and len(rows) == 2
