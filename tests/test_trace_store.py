"""The SQLite trace store: seed schema, round trip, replace-on-replay, concurrency, rows written while a
rollout runs, failures, SIGKILL."""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import MODEL, FakeLLMPolicy, first_line, llm_rollout, run_llm_rollout, store_result, with_run_id

from task_app.game import WorldFactory
from task_app.rollout.engine import RolloutEngine
from task_app.rollout.result import RolloutResult
from task_app.tracing import MIGRATIONS, SCHEMA_VERSION, TraceStore, build_session_trace
from task_app.tracing import store as store_module
from task_app.tracing.recording import RolloutRows
from task_app.tracing.rows import SessionRows, SessionRowsBuilder, session_rows
from task_app.tracing.schema import WRITE_ONLY_INDEXES, migrate

pytestmark = pytest.mark.anyio

# docs/compatibility.md, "Trace tables", without the libSQL-only `embedding` columns.
SEED_COLUMNS = {
    "experiments": ["experiment_id", "name", "description", "created_at", "updated_at", "configuration", "metadata"],
    "systems": ["system_id", "name", "system_type", "description", "created_at", "metadata"],
    "system_versions": [
        "version_id",
        "system_id",
        "version_number",
        "commit_hash",
        "created_at",
        "configuration",
        "metadata",
    ],
    "experimental_systems": ["id", "experiment_id", "system_id", "version_id"],
    "session_traces": [
        "session_id",
        "created_at",
        "num_timesteps",
        "num_events",
        "num_messages",
        "metadata",
        "experiment_id",
    ],
    "session_timesteps": [
        "id",
        "session_id",
        "step_id",
        "step_index",
        "turn_number",
        "started_at",
        "completed_at",
        "num_events",
        "num_messages",
        "step_metadata",
    ],
    "events": [
        "id",
        "session_id",
        "timestep_id",
        "event_type",
        "system_instance_id",
        "event_time",
        "message_time",
        "created_at",
        "model_name",
        "provider",
        "input_tokens",
        "output_tokens",
        "total_tokens",
        "cost_usd",
        "latency_ms",
        "span_id",
        "trace_id",
        "call_records",
        "reward",
        "terminated",
        "truncated",
        "system_state_before",
        "system_state_after",
        "metadata",
        "event_metadata",
    ],
    "messages": [
        "id",
        "session_id",
        "timestep_id",
        "message_type",
        "content",
        "timestamp",
        "event_time",
        "message_time",
        "metadata",
    ],
    "outcome_rewards": [
        "id",
        "session_id",
        "total_reward",
        "achievements_count",
        "total_steps",
        "created_at",
        "reward_metadata",
    ],
    "event_rewards": [
        "id",
        "event_id",
        "session_id",
        "message_id",
        "turn_number",
        "reward_value",
        "reward_type",
        "key",
        "annotation",
        "source",
        "created_at",
    ],
}
SESSION_TABLES = ("session_traces", "session_timesteps", "events", "messages", "outcome_rewards", "event_rewards")


@pytest.fixture(scope="module")
def result(worlds: WorldFactory) -> RolloutResult:
    return llm_rollout(worlds, run_id="store-run", decisions=6)


@pytest.fixture(scope="module")
def short_result(worlds: WorldFactory) -> RolloutResult:
    return llm_rollout(worlds, run_id="store-run", decisions=2, seed=5)


def counts(path: Path, session_id: str | None = None) -> dict[str, int]:
    with sqlite3.connect(path) as conn:
        where, params = ("WHERE session_id = ?", (session_id,)) if session_id else ("", ())
        return {
            table: conn.execute(f"SELECT COUNT(*) FROM {table} {where}", params).fetchone()[0]
            for table in SESSION_TABLES
        }


def expected_counts(result: RolloutResult) -> dict[str, int]:
    trace = build_session_trace(result)
    steps = trace["session_time_steps"]
    return {
        "session_traces": 1,
        "session_timesteps": len(steps),
        "events": len(trace["event_history"]),
        "messages": len(trace["markov_blanket_message_history"]),
        "outcome_rewards": 1,
        "event_rewards": sum(len(step["step_metadata"]["event_rewards"]) for step in steps),
    }


async def test_schema_matches_the_seed(tmp_path: Path) -> None:
    path = tmp_path / "traces" / "t.db"
    async with TraceStore(path) as store:
        assert store.health()["status"] == "ok"
    with sqlite3.connect(path) as conn:
        for table, columns in SEED_COLUMNS.items():
            assert [row[1] for row in conn.execute(f"PRAGMA table_info({table})")] == columns, table
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def _indexes(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}


async def test_write_only_indexes_are_dropped_and_reads_still_use_indexes(
    tmp_path: Path, result: RolloutResult
) -> None:
    old = tmp_path / "v2.db"  # a file of the release before: all the seed's indexes
    with sqlite3.connect(old, isolation_level=None) as conn:
        migrate(conn, MIGRATIONS[:2])
    assert len(WRITE_ONLY_INDEXES) == 7 and set(WRITE_ONLY_INDEXES) <= _indexes(old)
    for path in (tmp_path / "new.db", old):
        async with TraceStore(path) as store:
            assert store.schema_version == SCHEMA_VERSION
            assert (await store_result(store, result))["stored"]
            assert (await store.get_session("store-run")) is not None
            assert len(await store.list_sessions(model=MODEL, since="2000-01-01")) == 1
        indexes = _indexes(path)
        assert not indexes & set(WRITE_ONLY_INDEXES)
        assert {"idx_event_session_step", "idx_message_session_step", "idx_event_trace"} <= indexes
        assert counts(path) == expected_counts(result)
        with sqlite3.connect(path) as conn:  # every per-session read goes through an index, none scans a table
            for table in ("session_timesteps", "events", "messages", "event_rewards", "outcome_rewards"):
                plan = conn.execute(f"EXPLAIN QUERY PLAN SELECT * FROM {table} WHERE session_id = ?", ("x",))
                assert all("USING" in row[3] for row in plan), table
            timestep = conn.execute(
                "EXPLAIN QUERY PLAN SELECT id FROM session_timesteps WHERE session_id = ? AND step_id = ?", ("x", "y")
            )
            assert all("USING" in row[3] for row in timestep)


async def test_round_trip(tmp_path: Path, result: RolloutResult) -> None:
    path = tmp_path / "t.db"
    async with TraceStore(path) as store:
        assert await store_result(store, result) == {"stored": True}
        stored = await store.get_session("store-run")
        sessions = await store.list_sessions()
        assert await store.get_session("missing") is None
        assert store.health()["written"] == 1
    expected = build_session_trace(result)
    assert stored is not None
    for key in (
        "session_id",
        "created_at",
        "session_time_steps",
        "event_history",
        "markov_blanket_message_history",
        "metadata",
        "session_metadata",
    ):
        assert stored[key] == expected[key], key
    assert stored["outcome_reward"] == expected["metadata"]["outcome_reward"]
    assert counts(path) == expected_counts(result)
    [summary] = sessions
    assert summary["session_id"] == "store-run" and summary["num_timesteps"] == 6
    assert summary["model"] == MODEL and summary["total_steps"] == 6
    with sqlite3.connect(path) as conn:
        types = conn.execute("SELECT event_type, COUNT(*) FROM events GROUP BY event_type ORDER BY 1").fetchall()
        assert types == [("cais", 6), ("environment", 6)]
        row = conn.execute("SELECT model_name, input_tokens, trace_id FROM events WHERE event_type = 'cais'").fetchone()
        assert row == (MODEL, 812, "trace_fake_cid")
        (orphans,) = conn.execute("SELECT COUNT(*) FROM events WHERE timestep_id IS NULL").fetchone()
        assert orphans == 0


async def test_event_rewards_are_stored_against_the_env_event(tmp_path: Path, result: RolloutResult) -> None:
    import dataclasses

    record = result.records[1]
    unlocking = dataclasses.replace(record, outcome=dataclasses.replace(record.outcome, unlocked=("collect_wood",)))
    records = [*result.records[:1], unlocking, *result.records[2:]]
    rewarded = dataclasses.replace(with_run_id(result, "rewarded"), records=records)
    path = tmp_path / "t.db"
    async with TraceStore(path) as store:
        assert (await store_result(store, rewarded))["stored"]
        stored = await store.get_session("rewarded")
    assert stored is not None
    assert [(r["reward_type"], r["turn_number"], r["annotation"]) for r in stored["event_rewards"]] == [
        ("achievement_delta", 1, {"achievements": ["collect_wood"]}),
        ("unique_achievement_delta", 1, {"achievements": ["collect_wood"]}),
    ]
    with sqlite3.connect(path) as conn:
        kinds = conn.execute(
            "SELECT e.event_type, t.step_id FROM event_rewards r JOIN events e ON e.id = r.event_id "
            "JOIN session_timesteps t ON t.id = e.timestep_id"
        ).fetchall()
    assert kinds == [("environment", "decision_1"), ("environment", "decision_1")]


async def test_same_run_id_replaces(tmp_path: Path, result: RolloutResult, short_result: RolloutResult) -> None:
    path = tmp_path / "t.db"
    async with TraceStore(path) as store:
        assert (await store_result(store, result))["stored"]
        assert (await store_result(store, result))["stored"]
        assert counts(path) == expected_counts(result)
        assert (await store_result(store, short_result))["stored"]  # same run_id, a different (shorter) run
        stored = await store.get_session("store-run")
    assert counts(path) == expected_counts(short_result)
    assert stored is not None and len(stored["session_time_steps"]) == 2


async def test_32_concurrent_rollouts_write_at_once(tmp_path: Path, worlds: WorldFactory) -> None:
    path = tmp_path / "t.db"

    async def one(store: TraceStore, index: int) -> tuple[dict[str, Any], RolloutResult]:
        result = await run_llm_rollout(worlds, run_id=f"concurrent-{index}", decisions=2 + index % 3, seed=index % 4)
        return await store_result(store, result), result

    async with TraceStore(path, queue_size=8) as store:
        started = time.perf_counter()
        outcomes = await asyncio.gather(*(one(store, index) for index in range(32)))
        elapsed = time.perf_counter() - started
        assert store.health()["written"] == 32
    assert [status for status, _ in outcomes] == [{"stored": True}] * 32
    total: dict[str, int] = {}
    for _, result in outcomes:
        expected = expected_counts(result)
        assert counts(path, result.plan.run_id) == expected
        for table, number in expected.items():
            total[table] = total.get(table, 0) + number
    assert counts(path) == total
    assert elapsed < 20, elapsed


def built_rows(result: RolloutResult) -> SessionRows:
    """The rows the server builds during a rollout: `write(rows=...)` then queues at once, in call order."""
    return session_rows(build_session_trace(result))


async def test_rollouts_that_end_together_share_one_commit(tmp_path: Path, result: RolloutResult) -> None:
    path = tmp_path / "t.db"
    results = [with_run_id(result, f"group-{index}") for index in range(12)]
    async with TraceStore(path) as store:
        statuses = await asyncio.gather(*(store.write(item.plan.run_id, built_rows(item)) for item in results))
        health = store.health()
    assert statuses == [{"stored": True}] * 12
    assert (health["written"], health["transactions"]) == (12, 1)
    for item in results:
        assert counts(path, item.plan.run_id) == expected_counts(result)


async def test_the_rollouts_of_one_commit_resume_one_loop_iteration_apart(
    tmp_path: Path, result: RolloutResult
) -> None:
    """A group commit hands its rollouts back one per iteration, so their ends never pile up in one."""
    results = [with_run_id(result, f"turns-{index}") for index in range(6)]
    iterations = 0

    async def count_iterations() -> None:
        nonlocal iterations
        while True:
            await asyncio.sleep(0)
            iterations += 1

    async with TraceStore(tmp_path / "t.db") as store:
        resumed: list[int] = []

        async def write(item: RolloutResult) -> None:
            await store.write(item.plan.run_id, built_rows(item))
            resumed.append(iterations)

        counter = asyncio.create_task(count_iterations())
        await asyncio.gather(*(write(item) for item in results))
        counter.cancel()
        assert store.health()["transactions"] == 1
    assert len(set(resumed)) == len(results)  # no two in the same iteration


async def test_a_group_stops_at_its_row_bound(
    tmp_path: Path, result: RolloutResult, monkeypatch: pytest.MonkeyPatch
) -> None:
    from task_app.tracing import store as store_module

    results = [with_run_id(result, f"bounded-{index}") for index in range(6)]
    rows = [built_rows(item) for item in results]
    monkeypatch.setattr(store_module, "MAX_BATCH_ROWS", 2 * rows[0].row_count)  # two rollouts a transaction
    async with TraceStore(tmp_path / "t.db") as store:
        statuses = await asyncio.gather(
            *(store.write(item.plan.run_id, r) for item, r in zip(results, rows, strict=True))
        )
        health = store.health()
    assert statuses == [{"stored": True}] * 6
    assert (health["written"], health["transactions"]) == (6, 3)


async def test_a_bad_trace_in_a_group_fails_alone(tmp_path: Path, result: RolloutResult) -> None:
    path = tmp_path / "t.db"
    results = [with_run_id(result, f"group-{index}") for index in range(4)]
    rows = [built_rows(item) for item in results]
    rows[1].events.append(("group-1", "too few values"))  # not insertable: the whole group's commit fails
    async with TraceStore(path) as store:
        statuses = await asyncio.gather(
            *(store.write(item.plan.run_id, r) for item, r in zip(results, rows, strict=True))
        )
        health = store.health()
    assert statuses[1]["stored"] is False and "bindings" in statuses[1]["error"]
    assert [statuses[index] for index in (0, 2, 3)] == [{"stored": True}] * 3
    assert (health["written"], health["failures"], health["status"]) == (3, 1, "ok")
    assert counts(path, "group-1") == dict.fromkeys(SESSION_TABLES, 0)  # nothing half-written
    for index in (0, 2, 3):
        assert counts(path, f"group-{index}") == expected_counts(result)


async def test_a_run_written_twice_in_one_group_is_replaced_not_merged(
    tmp_path: Path, result: RolloutResult, short_result: RolloutResult
) -> None:
    path = tmp_path / "t.db"
    async with TraceStore(path) as store:  # both are run "store-run"; the later write wins
        statuses = await asyncio.gather(
            *(store.write(item.plan.run_id, built_rows(item)) for item in (result, short_result))
        )
        health = store.health()
    assert statuses == [{"stored": True}] * 2 and health["transactions"] == 2
    assert counts(path) == expected_counts(short_result)


# --- rows written while the rollout runs ------------------------------------------------------------

TRACE_KEYS = ("session_id", "created_at", "session_time_steps", "event_history", "markov_blanket_message_history")


async def test_parts_stay_invisible_until_the_end_lands(tmp_path: Path, result: RolloutResult) -> None:
    path, trace = tmp_path / "t.db", build_session_trace(result)
    builder = SessionRowsBuilder("store-run")
    async with TraceStore(path) as store:
        for index, step in enumerate(trace["session_time_steps"]):
            builder.add_step(step)
            if index in (1, 3):  # two parts: decisions 0-1, then 2-3
                part = store.append(builder.take(), replace=index == 1)
                assert part is not None and await part == {"stored": True}
                assert await store.get_session("store-run") is None
                assert await store.list_sessions() == []
                assert counts(path, "store-run")["session_timesteps"] == index + 1
        status = await store.write("store-run", builder.take(trace), replace=False)  # the last two and the session
        stored = await store.get_session("store-run")
        health = store.health()
    assert status == {"stored": True}
    assert (health["written"], health["transactions"]) == (1, 3)
    assert counts(path) == expected_counts(result)
    assert stored is not None
    assert {key: stored[key] for key in TRACE_KEYS} == {key: trace[key] for key in TRACE_KEYS}


async def test_a_run_id_run_again_replaces_its_trace_from_the_first_part(
    tmp_path: Path, result: RolloutResult, short_result: RolloutResult
) -> None:
    path, trace = tmp_path / "t.db", build_session_trace(short_result)
    builder = SessionRowsBuilder("store-run")
    async with TraceStore(path) as store:
        assert (await store_result(store, result))["stored"]
        builder.add_step(trace["session_time_steps"][0])
        part = store.append(builder.take(), replace=True)
        assert part is not None and await part == {"stored": True}
        assert await store.get_session("store-run") is None  # the old run's trace is gone, the new one not there
        builder.add_step(trace["session_time_steps"][1])
        assert await store.write("store-run", builder.take(trace), replace=False) == {"stored": True}
    assert counts(path) == expected_counts(short_result)


async def test_an_end_queued_behind_its_parts_shares_their_transaction(tmp_path: Path, result: RolloutResult) -> None:
    path, trace = tmp_path / "t.db", build_session_trace(result)
    builder = SessionRowsBuilder("store-run")
    async with TraceStore(path) as store:
        parts = []
        for index, step in enumerate(trace["session_time_steps"]):
            builder.add_step(step)
            if index in (1, 3):
                parts.append(store.append(builder.take(), replace=index == 1))
        status = await store.write("store-run", builder.take(trace), replace=False)  # not waiting for the parts
        health = store.health()
        assert [await part for part in parts if part is not None] == [{"stored": True}] * 2
    assert status == {"stored": True}
    assert (health["written"], health["transactions"]) == (1, 1)
    assert counts(path) == expected_counts(result)


async def test_parts_wait_for_company_until_an_end_or_their_time_is_up(tmp_path: Path, result: RolloutResult) -> None:
    path, trace = tmp_path / "t.db", build_session_trace(result)
    steps = trace["session_time_steps"]
    builder = SessionRowsBuilder("store-run")
    async with TraceStore(path, part_gather_s=30.0) as store:
        builder.add_step(steps[0])
        part = store.append(builder.take(), replace=True)
        await asyncio.sleep(0.3)
        waiting = (store.health()["transactions"], counts(path, "store-run")["session_timesteps"])
        for step in steps[1:]:
            builder.add_step(step)
        started = time.monotonic()
        end = await store.write("store-run", builder.take(trace), replace=False)  # someone waits: no gathering
        ended_in = time.monotonic() - started
        assert part is not None and await part == {"stored": True}
        health = store.health()
    assert waiting == (0, 0)  # the part is queued, not committed
    assert end == {"stored": True} and ended_in < 5.0
    assert (health["written"], health["transactions"]) == (1, 1)
    assert counts(path) == expected_counts(result)
    async with TraceStore(tmp_path / "u.db", part_gather_s=0.2) as store:
        started = time.monotonic()
        alone = store.append(SessionRowsBuilder("other-run").take(), replace=True)
        assert alone is not None and await alone == {"stored": True}
        assert 0.2 <= time.monotonic() - started < 5.0  # committed when its time was up, with no end


async def test_a_full_queue_ends_the_parts_wait(tmp_path: Path, result: RolloutResult) -> None:
    steps = build_session_trace(result)["session_time_steps"]
    builder = SessionRowsBuilder("store-run")
    async with TraceStore(tmp_path / "t.db", queue_size=2, part_gather_s=30.0) as store:
        parts = []
        for index, step in enumerate(steps[:2]):
            builder.add_step(step)
            parts.append(store.append(builder.take(), replace=index == 0))
        assert not store.has_room
        async with asyncio.timeout(5.0):
            assert [await part for part in parts if part is not None] == [{"stored": True}] * 2


async def test_a_batch_worth_of_rows_ends_the_parts_wait(
    tmp_path: Path, result: RolloutResult, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = build_session_trace(result)["session_time_steps"]
    builder = SessionRowsBuilder("store-run")
    builder.add_step(steps[0])
    builder.add_step(steps[1])
    rows = builder.take()
    monkeypatch.setattr(store_module, "MAX_BATCH_ROWS", rows.row_count)
    async with TraceStore(tmp_path / "t.db", part_gather_s=30.0) as store:
        part = store.append(rows, replace=True)
        async with asyncio.timeout(5.0):
            assert part is not None and await part == {"stored": True}


async def test_an_end_whose_part_was_lost_is_refused_unwritten(tmp_path: Path, result: RolloutResult) -> None:
    path, trace = tmp_path / "t.db", build_session_trace(result)
    builder = SessionRowsBuilder("store-run")
    steps = trace["session_time_steps"]
    async with TraceStore(path) as store:
        builder.add_step(steps[0])
        part = builder.take()
        part.events.append(("store-run", "too few values"))  # not insertable: this part fails
        lost = store.append(part, replace=True)
        for step in steps[1:]:
            builder.add_step(step)
        end = await store.write("store-run", builder.take(trace), replace=False)
        assert lost is not None and (await lost)["stored"] is False
        failures = store.health()["failures"]
        assert await store.get_session("store-run") is None  # nothing of the end was written
        rewritten = await store.write("store-run", builder.finish(trace))  # what RolloutRows.commit does next
        rerun = SessionRowsBuilder("store-run")  # the run again, in a part and an end: replaced, so not refused
        rerun.add_step(steps[0])
        assert store.append(rerun.take(), replace=True) is not None
        for step in steps[1:]:
            rerun.add_step(step)
        again = await store.write("store-run", rerun.take(trace), replace=False)
    assert end == {"stored": False, "error": "an earlier part of this trace was not stored"}
    assert failures == 1  # the lost part; the refusal is not a storage failure of its own
    assert rewritten == {"stored": True} and again == {"stored": True}
    assert counts(path) == expected_counts(result)


async def test_discard_removes_the_parts_of_a_rollout_that_never_ends(tmp_path: Path, result: RolloutResult) -> None:
    path, trace = tmp_path / "t.db", build_session_trace(result)
    builder = SessionRowsBuilder("store-run")
    for step in trace["session_time_steps"][:3]:
        builder.add_step(step)
    async with TraceStore(path) as store:
        part = store.append(builder.take(), replace=True)
        assert part is not None and await part == {"stored": True}
        assert counts(path, "store-run")["session_timesteps"] == 3
        store.discard("store-run")
    assert counts(path) == dict.fromkeys(SESSION_TABLES, 0)  # close() wrote the queued removal


async def test_a_rollout_writes_a_part_per_flush_and_its_end_equals_the_whole_trace(
    tmp_path: Path, worlds: WorldFactory
) -> None:
    plan = (await run_llm_rollout(worlds, run_id="flushed-run", decisions=5)).plan
    earlier = await run_llm_rollout(worlds, run_id="flushed-run", decisions=2, seed=5)
    async with TraceStore(tmp_path / "t.db") as store:
        assert (await store_result(store, earlier))["stored"]  # an earlier attempt of the run: replaced
        rows = RolloutRows("flushed-run", store, flush_interval_s=0.0)  # a part after every decision
        result = await RolloutEngine(plan, FakeLLMPolicy(seed=3), worlds, on_record=rows.add).run()
        status = await rows.commit(result, lambda: pytest.fail("the rows were good: nothing to rebuild"))
        stored = await store.get_session("flushed-run")
        health = store.health()
    assert status == {"stored": True}
    assert health["written"] == 2  # the earlier run, then this one (its parts grouped as the writer found them)
    trace = build_session_trace(result)
    assert stored is not None
    assert {key: stored[key] for key in TRACE_KEYS} == {key: trace[key] for key in TRACE_KEYS}
    assert counts(tmp_path / "t.db") == expected_counts(result)


async def test_parts_that_failed_to_store_are_replaced_by_the_whole_trace_at_the_end(
    tmp_path: Path, worlds: WorldFactory
) -> None:
    path = tmp_path / "t.db"
    plan = (await run_llm_rollout(worlds, run_id="relocked-run", decisions=4)).plan
    async with TraceStore(path, busy_timeout_ms=50, part_gather_s=0.0) as store:  # each part tried at once
        rows = RolloutRows("relocked-run", store, flush_interval_s=0.0)
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock while the rollout runs
        try:
            result = await RolloutEngine(plan, FakeLLMPolicy(seed=3), worlds, on_record=rows.add).run()
            await asyncio.sleep(0.5)  # every part tried and refused
        finally:
            other.execute("ROLLBACK")
            other.close()
        failures = store.health()["failures"]
        status = await rows.commit(result, lambda: pytest.fail("the rows were good: nothing to rebuild"))
    assert failures == 1 and status == {"stored": True}  # the first part; the later ones were refused unwritten
    assert counts(path) == expected_counts(result)


async def test_list_sessions_filters(tmp_path: Path, result: RolloutResult, short_result: RolloutResult) -> None:
    import dataclasses

    rich = dataclasses.replace(
        with_run_id(result, "rich"),
        episodes=[dataclasses.replace(result.episodes[0], achievements=["collect_wood", "place_table"])],
    )
    async with TraceStore(tmp_path / "t.db") as store:
        for item in (rich, with_run_id(short_result, "poor")):
            assert (await store_result(store, item))["stored"]
        assert {s["session_id"] for s in await store.list_sessions()} == {"rich", "poor"}
        assert [s["session_id"] for s in await store.list_sessions(min_achievements=2)] == ["rich"]
        assert (await store.list_sessions(min_achievements=2))[0]["achievements"] == ["collect_wood", "place_table"]
        assert await store.list_sessions(model="other-model") == []
        assert len(await store.list_sessions(model=MODEL)) == 2
        assert await store.list_sessions(since="2999-01-01") == []
        assert len(await store.list_sessions(since=result.started_at.replace(year=2000))) == 2
        assert len(await store.list_sessions(limit=1)) == 1


async def test_not_a_database(tmp_path: Path, result: RolloutResult, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "t.db"
    path.write_bytes(b"this is not a database, just some bytes " * 200)
    store = TraceStore(path)
    with caplog.at_level(logging.WARNING, logger="task_app.tracing.store"):
        await store.start()
        status = await store_result(store, result)
    assert status["stored"] is False and "not a database" in status["error"]
    health = store.health()
    assert health["status"] == "degraded" and health["failures"] == 2 and "not a database" in health["last_error"]
    assert any(getattr(r, "run_id", None) == "store-run" for r in caplog.records if r.levelno == logging.WARNING)
    await store.close()
    assert path.read_bytes().startswith(b"this is not a database")


async def test_unwritable_location(tmp_path: Path, result: RolloutResult) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where a directory should be")
    store = TraceStore(blocker / "traces" / "t.db")
    await store.start()
    status = await store_result(store, result)
    assert status["stored"] is False and status["error"]
    assert store.health()["status"] == "degraded"
    await store.close()


async def test_disk_full_then_recovery(tmp_path: Path, result: RolloutResult) -> None:
    async with TraceStore(tmp_path / "t.db") as store:
        conn = store._write_conn  # the limit is the writing connection's own
        assert conn is not None
        await store._in_writer_thread(lambda: conn.execute("VACUUM"))  # no free pages for the write to reuse
        pages = await store._in_writer_thread(lambda: conn.execute("PRAGMA page_count").fetchone()[0])
        await store._in_writer_thread(lambda: conn.execute(f"PRAGMA max_page_count = {pages}"))  # SQLITE_FULL
        status = await store_result(store, result)
        assert status["stored"] is False and "full" in status["error"]
        assert store.health()["status"] == "degraded"
        await store._in_writer_thread(lambda: conn.execute("PRAGMA max_page_count = 1073741823"))
        assert (await store_result(store, result))["stored"]
        health = store.health()
    assert (health["status"], health["failures"], health["written"]) == ("ok", 1, 1)
    assert counts(tmp_path / "t.db") == expected_counts(result)


async def test_locked_database_fails_the_write_not_the_rollout(tmp_path: Path, result: RolloutResult) -> None:
    path = tmp_path / "t.db"
    async with TraceStore(path, busy_timeout_ms=50) as store:
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        try:
            status = await store_result(store, result)
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert status["stored"] is False and "locked" in status["error"]
        assert (await store_result(store, result))["stored"]


async def test_slow_writer_times_out_but_the_job_still_lands(tmp_path: Path, result: RolloutResult) -> None:
    path = tmp_path / "t.db"
    async with TraceStore(path, write_timeout_s=0.05) as store:
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # the writer waits for the lock (busy_timeout 5 s)
        try:
            status = await store_result(store, result)
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert status["stored"] is False and "did not commit" in status["error"]
        assert store.health()["status"] == "degraded"
    assert counts(path) == expected_counts(result)  # close() drained the queue: the rollout was kept


async def test_write_after_close_and_readonly_store(tmp_path: Path, result: RolloutResult) -> None:
    path = tmp_path / "t.db"
    store = TraceStore(path)
    await store.start()
    assert (await store_result(store, result))["stored"]
    await store.close()
    await store.close()
    assert (await store_result(store, result))["stored"] is False
    async with TraceStore(path, readonly=True) as reader:
        assert [s["session_id"] for s in await reader.list_sessions()] == ["store-run"]
        assert (await reader.get_session("store-run")) is not None
        assert (await store_result(reader, result))["stored"] is False


def _page_size(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("PRAGMA page_size").fetchone()[0])


async def test_forward_migration_and_seed_database(tmp_path: Path, result: RolloutResult) -> None:
    path = tmp_path / "t.db"
    async with TraceStore(path) as store:
        assert (await store_result(store, result))["stored"]
    assert _page_size(path) == store_module.PAGE_SIZE  # a file we create: large pages
    newer = (*MIGRATIONS, ("CREATE TABLE IF NOT EXISTS trace_notes (session_id VARCHAR, note TEXT)",))
    async with TraceStore(path, migrations=newer) as store:
        assert store.schema_version == SCHEMA_VERSION + 1
        assert len(await store.list_sessions()) == 1
    async with TraceStore(path) as store:  # an older release opens a newer file and still writes
        assert store.schema_version == SCHEMA_VERSION + 1
        assert (await store_result(store, with_run_id(result, "second")))["stored"]

    seed_path = tmp_path / "seed.db"
    with sqlite3.connect(seed_path) as conn:  # the seed's tables, with their embedding columns, version 0
        conn.execute(
            "CREATE TABLE session_traces (session_id VARCHAR PRIMARY KEY, created_at DATETIME NOT NULL, "
            "num_timesteps INTEGER NOT NULL, num_events INTEGER NOT NULL, num_messages INTEGER NOT NULL, "
            "metadata TEXT, experiment_id VARCHAR, embedding VECTOR)"
        )
        conn.execute("INSERT INTO session_traces VALUES ('old', '2025-01-01 00:00:00', 0, 0, 0, '{}', NULL, NULL)")
    async with TraceStore(seed_path) as store:
        assert store.schema_version == SCHEMA_VERSION
        assert (await store_result(store, result))["stored"]
        assert {s["session_id"] for s in await store.list_sessions()} == {"old", "store-run"}
    assert _page_size(seed_path) == 4096  # a file from elsewhere keeps its own


_KILL_HELPER = textwrap.dedent(
    """
    import asyncio, dataclasses, pickle, sys
    from task_app.tracing import TraceStore, build_session_trace
    from task_app.tracing.rows import session_rows

    async def main(db, source, count):
        with open(source, "rb") as handle:
            base = pickle.load(handle)
        store = TraceStore(db, queue_size=4)
        await store.start()
        results = [
            dataclasses.replace(base, plan=dataclasses.replace(base.plan, run_id=f"killed-{index}"))
            for index in range(count)
        ]
        rows = [(r.plan.run_id, session_rows(build_session_trace(r))) for r in results]
        statuses = await asyncio.gather(*(store.write(*item) for item in rows))
        if not all(status["stored"] for status in statuses):
            raise SystemExit(f"not stored: {statuses}")
        sys.stdout.write("written\\n")
        sys.stdout.flush()
        await asyncio.sleep(3600)  # never closes the store: the parent kills us here

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
    """
)


def test_sigkill_right_after_writes_loses_nothing(tmp_path: Path, result: RolloutResult) -> None:
    count = 12
    source, script, db = tmp_path / "result.pickle", tmp_path / "writer.py", tmp_path / "t.db"
    source.write_bytes(pickle.dumps(result))
    script.write_text(_KILL_HELPER)
    command = [sys.executable, str(script), str(db), str(source), str(count)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        try:
            line = first_line(proc, timeout=60)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            _, errors = proc.communicate(timeout=30)
        assert line == "written\n", errors
    assert proc.returncode == -signal.SIGKILL
    assert Path(f"{db}-wal").exists()  # the commits were still in the WAL, never checkpointed
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        sessions = [row[0] for row in conn.execute("SELECT session_id FROM session_traces ORDER BY 1")]
    assert sessions == sorted(f"killed-{index}" for index in range(count))
    per_run = expected_counts(result)
    assert counts(db) == {table: number * count for table, number in per_run.items()}
