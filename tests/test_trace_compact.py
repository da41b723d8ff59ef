"""Compact trace rows: each prompt text stored once per session, read back byte for byte."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path

import pytest
from support.policies import SYSTEM_PROMPT, FakeLLMPolicy, ScriptedPolicy
from support.rollouts import deaths_rollout, llm_rollout, run_llm_rollout
from support.traces import store_result

from task_app.game import WorldFactory
from task_app.rollout.engine import RolloutEngine
from task_app.rollout.result import RolloutResult
from task_app.tracing import TraceStore, build_session_trace
from task_app.tracing.recording import RolloutRows
from task_app.tracing.rows import SessionRows, SessionRowsBuilder, session_rows

pytestmark = pytest.mark.anyio

DECISIONS = 8


@pytest.fixture(scope="module")
def result(worlds: WorldFactory) -> RolloutResult:
    return llm_rollout(worlds, run_id="compact-run", decisions=DECISIONS)


def _full_size(trace: dict) -> int:
    """Bytes the same rows would take with every text in full (the format before compaction)."""
    total = 0
    for step in trace["session_time_steps"]:
        total += sum(len(message["content"]["json_payload"]) for message in step["markov_blanket_messages"])
        total += sum(len(json.dumps(event.get("call_records"))) for event in step["events"] if "call_records" in event)
    return total


async def test_the_system_prompt_is_stored_once(tmp_path: Path, result: RolloutResult) -> None:
    path = tmp_path / "t.db"
    async with TraceStore(path) as store:
        assert await store_result(store, result) == {"stored": True}
    with sqlite3.connect(path) as conn:
        contents = [row[0] for row in conn.execute("SELECT content FROM messages WHERE session_id = 'compact-run'")]
        records = [row[0] for row in conn.execute("SELECT call_records FROM events WHERE event_type = 'cais'")]
    assert sum(SYSTEM_PROMPT in content for content in contents) == 1  # the first system message, in full
    assert not any(SYSTEM_PROMPT in record for record in records)
    assert len(records) == DECISIONS
    stored = sum(len(text) for text in contents) + sum(len(text) for text in records)
    assert stored < _full_size(build_session_trace(result)) / 2


async def test_round_trip_is_exact(tmp_path: Path, result: RolloutResult) -> None:
    async with TraceStore(tmp_path / "t.db") as store:
        assert (await store_result(store, result))["stored"]
        stored = await store.get_session("compact-run")
    expected = build_session_trace(result)
    assert stored is not None
    for key in ("session_time_steps", "event_history", "markov_blanket_message_history"):
        assert stored[key] == expected[key], key
    system = stored["session_time_steps"][-1]["markov_blanket_messages"][0]
    assert system["message_type"] == "system" and system["content"]["text"] == SYSTEM_PROMPT


async def test_vision_and_scripted_steps_round_trip(tmp_path: Path, worlds: WorldFactory) -> None:
    """Image inputs and steps without an LLM call are stored in full and read back unchanged."""
    vision = await run_llm_rollout(worlds, run_id="vision-run", decisions=3, policy=FakeLLMPolicy(image=True))
    scripted = await run_llm_rollout(worlds, run_id="scripted-run", decisions=3, policy=FakeLLMPolicy(lm=False))
    async with TraceStore(tmp_path / "t.db") as store:
        for item in (vision, scripted):
            assert (await store_result(store, item))["stored"]
            stored = await store.get_session(item.plan.run_id)
            assert stored is not None
            expected = build_session_trace(item)
            assert stored["session_time_steps"] == expected["session_time_steps"]


def test_a_changed_system_prompt_is_stored_again(result: RolloutResult) -> None:
    """A step whose system prompt differs is not a reference to the first one."""
    record = result.records[3]
    call = record.decision.lm_call  # type: ignore[union-attr]
    other = dataclasses.replace(call, messages=[{"role": "system", "content": "other"}, *call.messages[1:]])
    decision = dataclasses.replace(record.decision, lm_call=other)  # type: ignore[type-var]
    records = [*result.records[:3], dataclasses.replace(record, decision=decision), *result.records[4:]]
    rows = session_rows(dataclasses.replace(result, records=records))
    system_rows = [row.content for row in rows.messages if row.message_type == "system"]
    assert sum(SYSTEM_PROMPT in body for body in system_rows) == 1
    assert any('"content":"other"' in body for body in system_rows)


async def test_rows_built_during_the_rollout_equal_rows_built_at_the_end(worlds: WorldFactory) -> None:
    rows = RolloutRows("incremental-run")
    seen: list[int] = []

    def on_record(result: RolloutResult, record: object) -> None:
        seen.append(len(result.records))
        rows.add(result, record)  # type: ignore[arg-type]

    result = await run_llm_rollout(worlds, run_id="incremental-run", decisions=5)
    engine = RolloutEngine(result.plan, FakeLLMPolicy(seed=3), worlds, on_record=on_record)
    result = await engine.run()
    assert seen == [1, 2, 3, 4, 5]
    assert rows.rows(result) == session_rows(result)


SHAPING = {"enabled": True, "mode": "decision_stepwise", "strategy": "per_achievement"}
KINDS_OF_DECISIONS = {
    "model calls": {"decisions": 6},
    "images": {"decisions": 3, "policy": FakeLLMPolicy(image=True)},
    "no model call": {"decisions": 3, "policy": FakeLLMPolicy(lm=False)},
    "failed calls": {"decisions": 4, "policy": FakeLLMPolicy(fail_turns=(1, 2))},
    "step rewards": {"decisions": 4, "step_rewards": SHAPING},
    "injected noops": {"decisions": 2, "ops": ["env", "agent", "env", "env", "agent", "env"]},
}
# A sapling from the grass within twelve decisions, and an unknown action ("fly") rejected every fourth.
WANDER = [
    ["move_left", "do", "do", "fly"],
    ["move_up", "do", "do"],
    ["move_right", "do", "do"],
    ["move_down", "do", "do"],
]
UNLOCKING = {"unlocks and rejections": {}, "unlocks, rejections and step rewards": {"step_rewards": SHAPING}}


@pytest.mark.parametrize("kind", KINDS_OF_DECISIONS)
async def test_rows_read_back_as_the_structured_trace(tmp_path: Path, worlds: WorldFactory, kind: str) -> None:
    """The one row builder, over every kind of decision: stored and read back, the structured trace."""
    result = await run_llm_rollout(worlds, run_id="rows-" + kind.replace(" ", "-"), **KINDS_OF_DECISIONS[kind])
    await _assert_round_trip(tmp_path, result)


@pytest.mark.parametrize("kind", UNLOCKING)
async def test_rows_with_event_rewards_read_back(tmp_path: Path, worlds: WorldFactory, kind: str) -> None:
    policy = ScriptedPolicy(WANDER)
    result = await run_llm_rollout(worlds, run_id="unlocks", decisions=12, seed=1, policy=policy, **UNLOCKING[kind])
    assert any(record.plan.rejected for record in result.records)
    stored = await _assert_round_trip(tmp_path, result)
    assert (
        stored["event_rewards"]
        == [
            reward
            for step in build_session_trace(result)["session_time_steps"]
            for reward in step["step_metadata"]["event_rewards"]
        ]
        != []
    )


@pytest.fixture(scope="module")
def deaths(worlds: WorldFactory) -> RolloutResult:
    return deaths_rollout(worlds, decisions=6)


async def test_rows_across_episodes_read_back(tmp_path: Path, deaths: RolloutResult) -> None:
    assert len(deaths.episodes) > 1
    await _assert_round_trip(tmp_path, deaths)


def test_rows_taken_in_parts_are_the_rows_built_at_once(result: RolloutResult) -> None:
    builder = SessionRowsBuilder(result.plan.run_id)
    parts: list[SessionRows] = []
    for index, record in enumerate(result.records):
        builder.add(result, record)
        if index % 3 == 2:
            parts.append(builder.take())
    parts.append(builder.take(result))
    whole = session_rows(result)
    assert [part.session for part in parts] == [None] * (len(parts) - 1) + [whole.session]
    for group in ("timesteps", "events", "messages", "event_rewards"):
        assert [row for part in parts for row in getattr(part, group)] == getattr(whole, group), group
    assert whole.session is not None and whole.session.num_timesteps == DECISIONS
    assert (whole.session.num_events, whole.session.num_messages) == (len(whole.events), len(whole.messages))


async def _assert_round_trip(tmp_path: Path, result: RolloutResult) -> dict:
    async with TraceStore(tmp_path / f"{result.plan.run_id}.db") as store:
        assert await store.write(result.plan.run_id, session_rows(result)) == {"stored": True}
        stored = await store.get_session(result.plan.run_id)
    expected = build_session_trace(result)
    assert stored is not None
    assert {key: stored[key] for key in expected} == expected
    assert stored["outcome_reward"] == expected["metadata"]["outcome_reward"]
    return stored


async def test_failing_rows_fall_back_to_the_full_build(worlds: WorldFactory, caplog: pytest.LogCaptureFixture) -> None:
    result = await run_llm_rollout(worlds, run_id="broken-rows", decisions=2)
    rows = RolloutRows("broken-rows")
    rows.add(result, object())  # type: ignore[arg-type] - not a record: the builder gives up, loudly
    assert rows.rows(result) is None
    assert "trace rows failed" in caplog.text
    partial = RolloutRows("broken-rows")
    partial.add(result, result.records[0])
    assert partial.rows(result) is None  # a record missed: never store a trace that disagrees with the result
