"""SFT JSONL (docs/compatibility.md, "SFT records"): records field by field, safe names, atomic per-run files."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from helpers import MODEL, SYSTEM_PROMPT, FakeLLMPolicy, llm_rollout, run_llm_rollout, store_result, with_run_id

from task_app.game import WorldFactory
from task_app.rollout.result import RolloutResult
from task_app.tracing import (
    SftWriter,
    TraceStore,
    build_session_trace,
    safe_name,
    sft_filename,
    sft_records,
    sft_records_from_trace,
)

RECORD_KEYS = {"run_id", "turn", "model", "provider", "dialogue", "dialogue_text", "assistant", "metadata", "timestamp"}
SAFE = re.compile(r"^[A-Za-z0-9._-]+$")


def files_in(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def result(worlds: WorldFactory) -> RolloutResult:
    return llm_rollout(worlds, run_id="sft-run", decisions=3)


def test_records_field_by_field(result: RolloutResult) -> None:
    records = sft_records(result)
    assert len(records) == 3
    for record, decision in zip(records, result.records, strict=True):
        call = decision.decision.lm_call  # type: ignore[union-attr]
        assert call is not None and call.assistant_message is not None
        assert set(record) == RECORD_KEYS
        assert (record["run_id"], record["turn"], record["model"], record["provider"]) == (
            "sft-run",
            decision.index,
            MODEL,
            "openai",
        )
        assert record["dialogue"] == [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": call.messages[1]["content"]},
        ]
        assert decision.obs_text in record["dialogue"][1]["content"]
        assert record["dialogue_text"] == record["dialogue"]  # plain strings already
        assert record["assistant"] == {
            "content": "",
            "content_text": "",
            "tool_calls": call.assistant_message["tool_calls"],
            "has_image": False,
        }
        assert record["metadata"] == {
            "user_has_image": False,
            "assistant_has_image": False,
            "has_image": False,
            "usable": True,
            "episode": 0,
            "reward": decision.outcome.reward,
            "achievements_added": list(decision.outcome.unlocked),
            "finish_reason": "tool_calls",
        }
        stamp = datetime.fromisoformat(record["timestamp"])
        assert stamp.utcoffset() == timedelta(0) and stamp == call.finished_at
    assert [record["turn"] for record in records] == [0, 1, 2]


def test_image_records(worlds: WorldFactory) -> None:
    result = llm_rollout(worlds, run_id="sft-image", decisions=1, policy=FakeLLMPolicy(image=True))
    [record] = sft_records(result)
    assert record["metadata"]["user_has_image"] is True and record["metadata"]["has_image"] is True
    assert record["dialogue"][1]["content"][1]["type"] == "image_url"
    assert record["dialogue_text"][1]["content"].startswith("Turn 0.")
    from_stored = sft_records_from_trace(build_session_trace(result))
    assert from_stored[0]["metadata"]["has_image"] is True
    assert "base64" not in json.dumps(from_stored[0]["dialogue"])
    full = sft_records_from_trace(build_session_trace(result, "full"))
    assert full[0]["dialogue"] == record["dialogue"]


def test_skips_decisions_without_an_answer(worlds: WorldFactory) -> None:
    assert sft_records(llm_rollout(worlds, run_id="scripted", decisions=2, policy=FakeLLMPolicy(lm=False))) == []
    failing = llm_rollout(worlds, run_id="failing", decisions=3, policy=FakeLLMPolicy(fail_turns=[1]))
    assert [record["turn"] for record in sft_records(failing)] == [0, 2]
    assert [record["turn"] for record in sft_records_from_trace(build_session_trace(failing))] == [0, 2]
    injected = llm_rollout(worlds, run_id="noop", decisions=2, ops=["env", "agent", "env"])
    assert [record["turn"] for record in sft_records(injected)] == [1]


@pytest.mark.parametrize(
    "run_id",
    ["../../etc/passwd", "a/b", "a_b", "x\x00y", "..", ".hidden", "", "a" * 10_000, "run:with:colons", "ü/é\\\\"],
)
def test_file_names_are_safe(tmp_path: Path, run_id: str) -> None:
    name = sft_filename(run_id, datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC))
    assert SAFE.match(name) and not name.startswith(".") and len(name) < 120
    assert name.endswith("_2025-01-02T03-04-05Z.jsonl")
    assert (tmp_path / name).resolve().parent == tmp_path.resolve()


def test_distinct_run_ids_get_distinct_names() -> None:
    ids = ["a/b", "a_b", "a b", "a" * 100, "a" * 101]
    assert len({safe_name(run_id) for run_id in ids}) == len(ids)
    assert safe_name("run-1").startswith("run-1-")


@pytest.mark.anyio
async def test_writer_writes_one_file_atomically(tmp_path: Path, result: RolloutResult) -> None:
    directory = tmp_path / "sft" / "nested"
    writer = SftWriter(directory)
    await writer.start()
    status = await writer.write(with_run_id(result, "../escape/attempt"))
    assert status["written"] is True and status["records"] == 3
    assert files_in(directory) == [status["file"]]
    assert SAFE.match(status["file"]) and status["file"].startswith("escape_attempt-")
    lines = read_lines(directory / status["file"])
    expected = sft_records(with_run_id(result, "../escape/attempt"))
    assert [json.loads(line) for line in lines] == expected
    assert files_in(tmp_path / "sft") == ["nested"]  # no temp file left behind, nothing outside


@pytest.mark.anyio
async def test_writer_without_lm_calls_writes_nothing(tmp_path: Path, worlds: WorldFactory) -> None:
    scripted = await run_llm_rollout(worlds, run_id="scripted", decisions=1, policy=FakeLLMPolicy(lm=False))
    writer = SftWriter(tmp_path)
    await writer.start()
    assert await writer.write(scripted) == {"written": False, "records": 0}
    assert files_in(tmp_path) == []


@pytest.mark.anyio
async def test_writer_failure_is_a_status_not_an_exception(tmp_path: Path, result: RolloutResult) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    writer = SftWriter(blocker / "sft")
    await writer.start()
    status = await writer.write(result)
    assert status["written"] is False and status["error"]
    assert writer.failures == 2

    directory = tmp_path / "sft"
    writer = SftWriter(directory)
    await writer.start()
    directory.rmdir()  # the directory vanished after start (volume unmounted)
    status = await writer.write(result)
    assert status["written"] is False and "FileNotFoundError" in status["error"]


@pytest.mark.anyio
async def test_export_from_the_store_matches_the_live_records(tmp_path: Path, result: RolloutResult) -> None:
    async with TraceStore(tmp_path / "t.db") as store:
        assert (await store_result(store, result))["stored"]
        stored = await store.get_session("sft-run")
    assert stored is not None
    assert sft_records_from_trace(stored) == sft_records(result)
