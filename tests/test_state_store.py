"""The state store's contract on every backend: memory, sqlite (one file, several processes) and
modal-dict, the last against `FakeModalDict` (tests/support/fakes.py), a double with `modal.Dict`'s documented
semantics (there is no Modal account here); a test below holds the backend to the real SDK's names."""

from __future__ import annotations

import inspect
import json
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import modal
import pytest
from support.fakes import FakeClock, FakeModalDict
from support.processes import ROOT

from task_app.store import StateStore, StoreUnavailable, open_store
from task_app.store.modal_dict import ModalDictStore
from task_app.store.modal_dict import _wrap as wrap
from task_app.store.sqlite import SqliteStore

pytestmark = pytest.mark.anyio


async def test_get_put_delete_and_get_many(backend: tuple[StateStore, FakeClock]) -> None:
    store, _ = backend
    assert await store.get("a/1") is None
    await store.put("a/1", b"one")
    await store.put("a/2", b"\x00two")
    await store.put("a/1", b"uno")  # overwrite
    assert await store.get("a/1") == b"uno"
    assert await store.get_many(["a/2", "missing", "a/1"]) == [b"\x00two", None, b"uno"]
    assert await store.scan("a/") == ["a/1", "a/2"]
    await store.delete(["a/1", "never-there"])
    assert await store.get("a/1") is None
    assert await store.scan("a/") == ["a/2"]


async def test_put_if_absent_has_one_winner(backend: tuple[StateStore, FakeClock]) -> None:
    store, _ = backend
    outcomes: list[bool] = []

    async def claim(value: bytes) -> None:
        outcomes.append(await store.put_if_absent("claim/0", value))

    async with anyio.create_task_group() as group:
        for index in range(20):
            group.start_soon(claim, str(index).encode())
    assert outcomes.count(True) == 1
    winner = outcomes.index(True)
    assert await store.get("claim/0") is not None
    assert await store.put_if_absent("claim/0", b"late") is False
    assert winner >= 0


async def test_ttl_expiry_frees_a_key_for_a_new_claim(backend: tuple[StateStore, FakeClock]) -> None:
    store, clock = backend
    assert await store.put_if_absent("slot/1", b"first", ttl_s=10)
    assert await store.put_if_absent("slot/1", b"second", ttl_s=10) is False
    clock.now += 9.9
    assert await store.get("slot/1") == b"first"
    clock.now += 0.2
    assert await store.get("slot/1") is None
    assert await store.get_many(["slot/1"]) == [None]
    assert await store.scan("slot/") == []
    assert await store.put_if_absent("slot/1", b"second", ttl_s=10)
    assert await store.get("slot/1") == b"second"
    await store.put("plain", b"forever")
    clock.now += 10_000
    assert await store.get("plain") == b"forever"
    assert await store.get("slot/1") is None


async def test_purge_drops_expired_entries(backend: tuple[StateStore, FakeClock]) -> None:
    store, clock = backend
    await store.put("t/1", b"x", ttl_s=1)
    await store.put("t/2", b"y")
    clock.now += 2
    purged = await store.purge()
    assert purged == (0 if store.name == "modal-dict" else 1)  # Modal expires entries on its own
    assert await store.scan("t/") == ["t/2"]


async def test_keys_are_checked(backend: tuple[StateStore, FakeClock]) -> None:
    store, _ = backend
    for bad in ("", "has space", "quote'", "x" * 600):
        with pytest.raises(ValueError, match="invalid state-store key"):
            await store.get(bad)
    with pytest.raises(ValueError, match="ttl_s"):
        await store.put("k", b"v", ttl_s=0)


async def test_open_store_reads_the_setting(tmp_path: Path) -> None:
    async with open_store("memory") as memory:
        assert memory.name == "memory"
    async with open_store(f"sqlite:{tmp_path / 'nested' / 'state.db'}") as sqlite:
        await sqlite.put("k", b"v")
    assert (tmp_path / "nested" / "state.db").exists()
    with pytest.raises(ValueError, match="unknown state backend"):
        async with open_store("redis:localhost"):
            pass


async def test_a_sqlite_write_waits_in_the_thread_while_another_writer_holds_the_file(tmp_path: Path) -> None:
    """One-key writes run on the loop with no busy wait; a busy file sends them to aiosqlite's thread, which
    waits for the other writer (sqlite.py) instead of failing."""
    store = await SqliteStore(tmp_path / "state.db").open()
    other = sqlite3.connect(tmp_path / "state.db", isolation_level=None, check_same_thread=False)
    try:
        await store.put("free", b"1")  # on the loop
        other.execute("BEGIN IMMEDIATE")  # holds the write lock
        other.execute("INSERT INTO kv (key, value) VALUES ('theirs', x'00')")

        async def release_later() -> None:
            await anyio.sleep(0.3)
            other.execute("COMMIT")

        async with anyio.create_task_group() as group:
            group.start_soon(release_later)
            started = anyio.current_time()
            assert await store.put_if_absent("claimed", b"2")
            assert anyio.current_time() - started >= 0.25  # it waited for the commit, off the loop
        assert await store.get_many(["free", "claimed", "theirs"]) == [b"1", b"2", b"\x00"]
    finally:
        other.close()
        await store.close()


async def test_an_unusable_sqlite_path_is_a_precise_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(StoreUnavailable, match="cannot open the state store"):
        await SqliteStore(tmp_path / "file" / "state.db").open()


@pytest.mark.e2e
def test_put_if_absent_has_one_winner_across_processes(tmp_path: Path) -> None:
    """Four processes race for the same 300 keys of one SQLite file: each key has exactly one winner."""
    path = tmp_path / "race.db"
    script = textwrap.dedent(
        f"""
        import asyncio, json, sys
        from task_app.store.sqlite import SqliteStore

        async def main():
            store = await SqliteStore({str(path)!r}).open()
            won = [key for key in range(300) if await store.put_if_absent(f"race/{{key}}", sys.argv[1].encode())]
            await store.close()
            print(json.dumps(won))

        asyncio.run(main())
        """
    )
    processes = [
        subprocess.Popen([sys.executable, "-c", script, str(index)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        for index in range(4)
    ]
    wins = [json.loads(process.communicate(timeout=120)[0]) for process in processes]
    assert all(process.returncode == 0 for process in processes)
    claimed = sorted(key for won in wins for key in won)
    assert claimed == list(range(300))  # every key won once, none twice

    async def owners() -> list[bytes | None]:
        store = await SqliteStore(path).open()
        try:
            return await store.get_many([f"race/{key}" for key in range(300)])
        finally:
            await store.close()

    stored = anyio.run(owners)
    for index, won in enumerate(wins):
        assert all(stored[key] == str(index).encode() for key in won)


# --- modal-dict: the double and the real SDK ---------------------------------------------------------


def test_the_backend_calls_only_what_modal_dict_offers() -> None:
    """The names and parameters ModalDictStore uses exist on modal 1.6.4's Dict, with `.aio` variants."""
    assert modal.__version__ == "1.6.4"
    for name in ("get", "put", "pop", "keys", "contains"):
        assert hasattr(getattr(modal.Dict, name), "aio"), name
    assert "skip_if_exists" in inspect.signature(modal.Dict.put).parameters
    assert "default" in inspect.signature(modal.Dict.get).parameters
    assert "default" in inspect.signature(modal.Dict.pop).parameters
    assert "create_if_missing" in inspect.signature(modal.Dict.from_name).parameters
    handle = ModalDictStore.from_name("crafter-task-app-state")  # lazy: no network until first use
    assert isinstance(handle._dict, modal.Dict)


async def test_values_reach_modal_as_bytes_and_expire_after_seven_idle_days() -> None:
    clock = FakeClock()
    fake = FakeModalDict(clock=clock)
    store = ModalDictStore(fake, clock=clock)
    await store.put("k", b"payload")
    (raw,) = [fake.get(key) for key in fake.keys()]
    assert isinstance(raw, bytes)  # what Modal pickles and unpickles is a bytes object of ours
    clock.now += 6 * 24 * 3600
    assert await store.get("k") == b"payload"  # a read is an access
    clock.now += 6 * 24 * 3600
    assert await store.get("k") == b"payload"
    clock.now += 7 * 24 * 3600 + 1
    assert await store.get("k") is None


class RivalClaimsFirst(FakeModalDict):
    """Another container pops the expired entry and claims the key between our read and our pop."""

    rival_done = False

    def _pop(self, key: object, default: object = None) -> object:
        if not self.rival_done:
            self.rival_done = True
            super()._pop(key)
            self._put(key, wrap(b"rival", self.clock() + 5), skip_if_exists=True)
        return super()._pop(key, default)


async def test_reclaiming_an_expired_modal_key() -> None:
    """The one multi-call path: an expired entry is popped and the key claimed again; when the entry
    popped is a rival's fresh claim instead, it is given back and the claim reports a loss."""
    clock = FakeClock()
    store = ModalDictStore(FakeModalDict(clock=clock), clock=clock)
    assert await store.put_if_absent("slot", b"old", ttl_s=5)
    clock.now += 6
    assert await store.put_if_absent("slot", b"new", ttl_s=5)
    assert await store.get("slot") == b"new"

    raced = ModalDictStore(RivalClaimsFirst(clock=clock), clock=clock)
    assert await raced.put_if_absent("slot", b"old", ttl_s=5)
    clock.now += 6
    assert await raced.put_if_absent("slot", b"mine", ttl_s=5) is False
    assert await raced.get("slot") == b"rival"


async def test_modal_calls_run_concurrently_and_failures_are_503s() -> None:
    fake = FakeModalDict(latency_s=0.05)
    store = ModalDictStore(fake)
    for index in range(40):
        fake.put(f"k/{index}", b"\x00" + bytes([index]))
    started = anyio.current_time()
    values = await store.get_many([f"k/{index}" for index in range(40)])
    assert [value[0] for value in values if value] == list(range(40))
    assert anyio.current_time() - started < 0.05 * 10  # 40 round trips, 32 at a time: about two of them

    class Broken(FakeModalDict):
        def _get(self, key: object, default: object = None) -> object:
            raise ConnectionError("modal is down")

    with pytest.raises(StoreUnavailable, match="modal.Dict call failed"):
        await ModalDictStore(Broken()).get("k")
