"""`task-app traces list | show | export` against a real trace database.

The database holds rollouts of the real engine and real crafter, driven by the fake chat model of
support/policies.py (`FakeLLMPolicy`) and written by the real TraceStore:

    alpha    fake model, the call of decision 1 fails (no answer)
    bravo    another model that also writes text next to its tool call
    charlie  scripted decisions (no LLM call at all)
    delta    fake model with image observations (the store keeps image references only)
    old      a copy of alpha created in 2020 (for --since)
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from support.policies import MODEL, SYSTEM_PROMPT, FakeLLMPolicy
from support.rollouts import run_llm_rollout, with_run_id
from support.traces import run_cli, store_result

from task_app.cli.traces import (
    TEXT_PREVIEW_CHARS,
    ExportStats,
    openai_sft_example,
    parse_since,
    session_summary,
)
from task_app.game import TOOL_NAME, Observation, WorldFactory
from task_app.policy.base import HistoryEntry, PolicyDecision
from task_app.policy.prompts import tool_schema
from task_app.rollout.result import RolloutResult
from task_app.tracing import TraceStore, build_session_trace, sft_records_from_trace

OTHER_MODEL = "other-model-70b"
DECISIONS = 30
LONG_TURN = 5  # bravo's answer at this turn is longer than `show` prints by default
RECORD_KEYS = {"run_id", "turn", "model", "provider", "dialogue", "dialogue_text", "assistant", "metadata", "timestamp"}
RUN_IDS = ("alpha", "bravo", "charlie", "delta", "old")


class TalkingPolicy(FakeLLMPolicy):
    """The fake model under another name, saying a sentence along with each tool call."""

    async def decide(self, observation: Observation, history: Sequence[HistoryEntry]) -> PolicyDecision:
        decision = await super().decide(observation, history)
        call = decision.lm_call
        if call is not None and call.assistant_message is not None:
            call.model = OTHER_MODEL
            turn = self.calls - 1
            long = " Then I chop it." * 20 if turn == LONG_TURN else ""
            call.assistant_message["content"] = f"Turn {turn}: I head for the nearest tree.{long}"
        return decision


@dataclass(frozen=True)
class Corpus:
    path: Path
    results: dict[str, RolloutResult]

    def achievements(self, run_id: str) -> int:
        return len(self.results[run_id].final_achievements)


async def _build(path: Path, worlds: WorldFactory) -> dict[str, RolloutResult]:
    results = {
        "alpha": await run_llm_rollout(
            worlds, run_id="alpha", decisions=DECISIONS, seed=1, policy=FakeLLMPolicy(seed=1, fail_turns=[1])
        ),
        "bravo": await run_llm_rollout(
            worlds, run_id="bravo", decisions=DECISIONS, seed=2, policy=TalkingPolicy(seed=2)
        ),
        "charlie": await run_llm_rollout(worlds, run_id="charlie", decisions=4, seed=3, policy=FakeLLMPolicy(lm=False)),
        "delta": await run_llm_rollout(worlds, run_id="delta", decisions=3, seed=3, policy=FakeLLMPolicy(image=True)),
    }
    old = dataclasses.replace(results["alpha"], started_at=datetime(2020, 1, 2, 3, 4, 5, tzinfo=UTC))
    results["old"] = with_run_id(old, "old")
    async with TraceStore(path) as store:
        for result in results.values():
            assert await store_result(store, result) == {"stored": True}
    return results


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, worlds: WorldFactory) -> Corpus:
    path = tmp_path_factory.mktemp("traces") / "task_app.db"
    return Corpus(path, asyncio.run(_build(path, worlds)))


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")  # rich tables do not fold the values the tests look for


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Any:
    """`cli("--db", path, "list")` runs `task-app traces ...` in-process through the real parser."""

    def run(*argv: str | Path) -> Run:
        code = run_cli(["traces", *argv])
        out, err = capsys.readouterr()
        return Run(code, out, err)

    return run


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def llm_tool_calls(result: RolloutResult) -> Iterator[list[dict[str, Any]]]:
    """The tool calls of every answered LLM call, in decision order."""
    for record in result.records:
        call = record.decision.lm_call if record.decision is not None else None
        if call is not None and call.assistant_message is not None:
            yield call.assistant_message["tool_calls"]


# --- list ------------------------------------------------------------------------------------------


def test_list_newest_first_as_json_and_table(cli: Any, corpus: Corpus) -> None:
    run = cli("--db", corpus.path, "list", "--json")
    assert run.code == 0
    sessions = run.json()
    assert [row["session_id"] for row in sessions] == ["delta", "charlie", "bravo", "alpha", "old"]
    by_id = {row["session_id"]: row for row in sessions}
    for run_id, result in corpus.results.items():
        row = by_id[run_id]
        assert row["achievements_count"] == len(result.final_achievements)
        assert row["num_timesteps"] == len(result.records)
        assert row["seed"] == result.plan.seed
    assert by_id["bravo"]["model"] == MODEL  # the requested model; the calls themselves answered as OTHER_MODEL

    table = cli("list", "--db", corpus.path)  # --db also works after the sub-command
    assert table.code == 0
    for run_id in RUN_IDS:
        assert run_id in table.out
    assert "2020-01-02 03:04" in table.out and "5 session(s)" in table.out


def test_list_filters(cli: Any, corpus: Corpus) -> None:
    def ids(*filters: str) -> set[str]:
        run = cli("--db", corpus.path, "list", "--json", *filters)
        assert run.code == 0, run.err
        return {row["session_id"] for row in run.json()}

    counts = {run_id: corpus.achievements(run_id) for run_id in RUN_IDS}
    top = max(counts.values())
    expected = {run_id for run_id, count in counts.items() if count >= top}
    assert 0 < len(expected) < len(RUN_IDS), counts  # the corpus must make this filter meaningful
    assert ids("--min-achievements", str(top)) == expected
    assert ids("--min-achievements", "0") == set(RUN_IDS)
    assert ids("--min-achievements", str(top + 1)) == set()

    assert ids("--model", OTHER_MODEL) == {"bravo"}
    assert ids("--model", MODEL) == {"alpha", "delta", "old"}  # charlie never called a model
    assert ids("--model", "no-such-model") == set()

    assert ids("--since", "7d") == {"alpha", "bravo", "charlie", "delta"}
    assert ids("--since", "2h") == {"alpha", "bravo", "charlie", "delta"}
    assert ids("--since", "2020-01-02") == set(RUN_IDS)
    assert ids("--since", "2020-01-03T00:00:00+00:00") == {"alpha", "bravo", "charlie", "delta"}
    assert ids("--since", "7d", "--model", MODEL, "--min-achievements", "0") == {"alpha", "delta"}
    assert ids("--limit", "2") == {"delta", "charlie"}


def test_since_accepts_durations_and_iso_dates() -> None:
    now = datetime.now(UTC)
    assert abs(parse_since("2h") - (now - timedelta(hours=2))) < timedelta(seconds=5)
    assert abs(parse_since("7d") - (now - timedelta(days=7))) < timedelta(seconds=5)
    assert abs(parse_since("30m") - (now - timedelta(minutes=30))) < timedelta(seconds=5)
    assert parse_since("2025-01-31") == datetime(2025, 1, 31, tzinfo=UTC)  # naive means UTC
    assert parse_since("2025-01-31T12:00:00+02:00") == datetime(2025, 1, 31, 10, tzinfo=UTC)
    with pytest.raises(argparse.ArgumentTypeError, match="duration"):
        parse_since("yesterday")


@pytest.mark.parametrize(
    "argv",
    [
        ["list", "--since", "soon"],
        ["list", "--min-achievements", "-1"],
        ["list", "--limit", "0"],
        ["show"],
        ["export", "--format", "csv", "-o", "x"],
        ["export"],
        [],
    ],
)
def test_bad_arguments_exit_2(cli: Any, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        cli(*argv)
    assert raised.value.code == 2
    assert "error" in capsys.readouterr().err


# --- show ------------------------------------------------------------------------------------------


def test_show_json_summarises_every_decision(cli: Any, corpus: Corpus) -> None:
    run = cli("--db", corpus.path, "show", "alpha", "--json")
    assert run.code == 0
    summary = run.json()
    result = corpus.results["alpha"]
    assert (summary["run_id"], summary["model"], summary["seed"]) == ("alpha", MODEL, 1)
    assert len(summary["decisions"]) == len(result.records) == DECISIONS
    for decision, record in zip(summary["decisions"], result.records, strict=True):
        assert decision["index"] == record.index
        assert decision["actions"] == record.outcome.actions
        assert decision["unlocked"] == list(record.outcome.unlocked)
        assert decision["reward"] == float(record.outcome.reward)
        call = record.decision.lm_call  # type: ignore[union-attr]
        assert call is not None
        assert decision["latency_ms"] == round(call.latency_ms)
        if record.index == 1:  # the failed call
            assert decision["error"].startswith("ReadTimeout") and decision["usable"] is False
            assert decision["input_tokens"] is None
        else:
            assert (decision["input_tokens"], decision["output_tokens"]) == (812, 24)
            assert decision["usable"] is True and decision["error"] is None
            arguments = json.loads(decision["tool_calls"][0])
            assert arguments == json.loads(call.assistant_message["tool_calls"][0]["function"]["arguments"])  # type: ignore[index]
    outcome = summary["outcome"]
    assert outcome["achievements"] == list(result.final_achievements)
    assert outcome["achievements_count"] == len(result.final_achievements)
    assert outcome["total_steps"] == DECISIONS and outcome["stop_reason"] == result.stop_reason
    assert outcome["episodes"][0]["steps"] == result.episodes[0].steps


def test_show_table_is_readable(cli: Any, corpus: Corpus) -> None:
    run = cli("--db", corpus.path, "show", "bravo")
    assert run.code == 0
    result = corpus.results["bravo"]
    assert "Run bravo" in run.out and "seed 2" in run.out
    assert "Turn 0: I head for the nearest tree." in run.out  # the model's text
    assert " ".join(result.records[0].outcome.actions) in run.out
    assert "812→24" in run.out
    for record in result.records:
        for name in record.outcome.unlocked:
            assert name in run.out
    assert f"{len(result.final_achievements)} achievement(s)" in run.out
    assert f"stop: {result.stop_reason}" in run.out

    failing = cli("--db", corpus.path, "show", "alpha")
    assert "error: ReadTimeout: model server did not answer" in failing.out
    scripted = cli("--db", corpus.path, "show", "charlie")
    assert scripted.out.count("(scripted)") == len(corpus.results["charlie"].records)


def test_show_shortens_long_text_unless_full(cli: Any, corpus: Corpus) -> None:
    long_text = cli("--db", corpus.path, "show", "bravo", "--json").json()["decisions"][LONG_TURN]["text"]
    assert len(long_text) > TEXT_PREVIEW_CHARS and long_text.endswith("Then I chop it.")
    short = cli("--db", corpus.path, "show", "bravo").out
    assert short.count("…") == 1 and long_text not in short and long_text[: TEXT_PREVIEW_CHARS - 1] in short
    full = cli("--db", corpus.path, "show", "bravo", "--full").out
    assert "…" not in full and "".join(long_text.split()) in "".join(full.split())  # whole, folded over lines


def test_show_unknown_run_exits_1(cli: Any, corpus: Corpus) -> None:
    run = cli("--db", corpus.path, "show", "no-such-run")
    assert run.code == 1
    assert "no run 'no-such-run'" in run.err and run.out == ""


# --- export ----------------------------------------------------------------------------------------


def test_export_jsonl_field_by_field(cli: Any, corpus: Corpus, tmp_path: Path) -> None:
    output = tmp_path / "out" / "sft.jsonl"  # the directory is created
    run = cli("--db", corpus.path, "export", "--format", "jsonl", "-o", output)
    assert run.code == 0, run.err
    records = read_jsonl(output)
    order = ("old", "alpha", "bravo", "charlie", "delta")  # oldest session first
    expected = [
        record for run_id in order for record in sft_records_from_trace(build_session_trace(corpus.results[run_id]))
    ]
    assert records == expected
    assert f"Wrote {len(records)} jsonl record(s) from 5 session(s)" in run.err

    alpha = [record for record in records if record["run_id"] == "alpha"]
    assert [record["turn"] for record in alpha] == [turn for turn in range(DECISIONS) if turn != 1]
    for record, tool_calls in zip(alpha, llm_tool_calls(corpus.results["alpha"]), strict=True):
        assert set(record) == RECORD_KEYS
        assert (record["model"], record["provider"]) == (MODEL, "openai")
        assert record["dialogue"][0] == {"role": "system", "content": SYSTEM_PROMPT}
        assert record["dialogue"][1]["role"] == "user" and record["dialogue"][1]["content"].startswith("Turn ")
        assert record["dialogue_text"] == record["dialogue"]
        assert record["assistant"] == {"content": "", "content_text": "", "tool_calls": tool_calls, "has_image": False}
        assert record["metadata"]["usable"] is True and record["metadata"]["finish_reason"] == "tool_calls"
        decision = corpus.results["alpha"].records[record["turn"]]
        assert record["metadata"]["reward"] == float(decision.outcome.reward)
        assert record["metadata"]["achievements_added"] == list(decision.outcome.unlocked)
        assert datetime.fromisoformat(record["timestamp"]).utcoffset() == timedelta(0)
    bravo = [record for record in records if record["run_id"] == "bravo"]
    assert bravo[0]["model"] == OTHER_MODEL
    assert bravo[0]["assistant"]["content_text"] == "Turn 0: I head for the nearest tree."
    assert not [record for record in records if record["run_id"] == "charlie"]  # scripted: no LLM call
    delta = [record for record in records if record["run_id"] == "delta"]
    assert delta[0]["metadata"]["has_image"] is True


def test_export_openai_sft_examples_are_valid(cli: Any, corpus: Corpus, tmp_path: Path) -> None:
    output = tmp_path / "openai.jsonl"
    run = cli("--db", corpus.path, "export", "--format", "openai-sft", "--since", "7d", "-o", output)
    assert run.code == 0, run.err
    examples = read_jsonl(output)
    usable = {run_id: list(llm_tool_calls(corpus.results[run_id])) for run_id in ("alpha", "bravo", "delta")}
    assert len(examples) == sum(len(calls) for calls in usable.values())  # the failed call and charlie: none
    for example in examples:
        assert set(example) == {"messages", "tools", "parallel_tool_calls"}
        assert example["tools"] == [tool_schema()] and example["tools"][0]["function"]["name"] == TOOL_NAME
        assert example["parallel_tool_calls"] is False
        messages = example["messages"]
        assert [message["role"] for message in messages] == ["system", "user", "assistant"]
        assert messages[0]["content"] == SYSTEM_PROMPT
        assert isinstance(messages[1]["content"], str) and messages[1]["content"].startswith("Turn ")
        [call] = messages[2]["tool_calls"]
        assert call["type"] == "function" and call["id"].startswith("call_")
        assert call["function"]["name"] == TOOL_NAME
        arguments = json.loads(call["function"]["arguments"])
        assert set(arguments) == {"actions"} and arguments["actions"]
        assert "image_ref" not in json.dumps(example)
    tool_calls = [calls[0] for run_id in ("alpha", "bravo", "delta") for calls in usable[run_id]]
    assert [example["messages"][2]["tool_calls"][0] for example in examples] == tool_calls  # the model's own calls
    talking = [example for example in examples if example["messages"][2].get("content")]
    assert len(talking) == len(usable["bravo"])
    assert talking[0]["messages"][2]["content"] == "Turn 0: I head for the nearest tree."
    assert "Dropped 3 image part(s)" in run.err  # delta's observations: text kept, image references dropped


def test_openai_sft_keeps_only_usable_interact_many_answers() -> None:
    def record(tool_calls: Any, usable: bool = True) -> dict[str, Any]:
        dialogue = [{"role": "system", "content": "rules"}, {"role": "user", "content": "obs"}]
        assistant = {"content": "", "content_text": "", "tool_calls": tool_calls, "has_image": False}
        return {"dialogue": dialogue, "assistant": assistant, "metadata": {"usable": usable}}

    def tool_call(name: str, arguments: Any) -> dict[str, Any]:
        return {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}

    stats = ExportStats()
    rejected = [
        record([tool_call(TOOL_NAME, '{"actions": ["do"]}')], usable=False),
        record([]),
        record([tool_call("interact", '{"actions": ["do"]}')]),
        record([tool_call(TOOL_NAME, "do, then noop")]),
        record([tool_call(TOOL_NAME, '{"actions": []}')]),
        record([tool_call(TOOL_NAME, '["do"]')]),
        record([tool_call(TOOL_NAME, '{"actions": ["do"]}'), "not a call"]),
    ]
    assert [openai_sft_example(item, stats) for item in rejected] == [None] * len(rejected)
    assert stats.skipped_unusable == len(rejected)

    example = openai_sft_example(record([tool_call(TOOL_NAME, {"actions": ["noop", "do"]})]), stats)
    assert example is not None
    [call] = example["messages"][-1]["tool_calls"]
    arguments = call["function"].pop("arguments")  # a JSON string, as fine-tuning expects
    assert call == {"id": "c1", "type": "function", "function": {"name": TOOL_NAME}}
    assert json.loads(arguments) == {"actions": ["noop", "do"]}
    assert "content" not in example["messages"][-1]


def test_show_marks_injected_noops(worlds: WorldFactory) -> None:
    result = asyncio.run(run_llm_rollout(worlds, run_id="noop-first", decisions=2, ops=["env", "agent", "env"]))
    decisions = session_summary(build_session_trace(result))["decisions"]
    assert [decision["source"] for decision in decisions] == ["injected noop", "llm"]
    assert decisions[0]["actions"] == ["noop"] and "latency_ms" not in decisions[0]


def test_export_filters(cli: Any, corpus: Corpus, tmp_path: Path) -> None:
    def run_ids(*filters: str) -> set[str]:
        output = tmp_path / "filtered.jsonl"
        run = cli("--db", corpus.path, "export", "--format", "jsonl", *filters, "-o", output)
        assert run.code == 0, run.err
        return {record["run_id"] for record in read_jsonl(output)}

    top = max(corpus.achievements(run_id) for run_id in RUN_IDS)
    expected = {run_id for run_id in RUN_IDS if corpus.achievements(run_id) >= top and run_id != "charlie"}
    assert run_ids("--min-achievements", str(top)) == expected
    assert run_ids("--model", OTHER_MODEL) == {"bravo"}
    assert run_ids("--since", "7d", "--model", MODEL) == {"alpha", "delta"}

    output = tmp_path / "none.jsonl"
    run = cli("--db", corpus.path, "export", "--format", "openai-sft", "--model", "nobody", "-o", output)
    assert run.code == 0 and output.read_text() == ""
    assert "No session matched" in run.err

    openai = tmp_path / "top.jsonl"
    assert (
        cli("--db", corpus.path, "export", "--format", "openai-sft", "--min-achievements", str(top), "-o", openai).code
        == 0
    )
    answered = sum(len(list(llm_tool_calls(corpus.results[run_id]))) for run_id in expected)
    assert len(read_jsonl(openai)) == answered


def test_export_replaces_the_file_atomically_and_never_the_database(cli: Any, corpus: Corpus, tmp_path: Path) -> None:
    output = tmp_path / "sft.jsonl"
    output.write_text("stale\n")
    assert cli("--db", corpus.path, "export", "--model", OTHER_MODEL, "-o", output).code == 0
    assert "stale" not in output.read_text() and len(read_jsonl(output)) == DECISIONS
    assert sorted(path.name for path in tmp_path.iterdir()) == ["sft.jsonl"]  # no temp file left

    before = digest(corpus.path)
    run = cli("--db", corpus.path, "export", "-o", corpus.path)
    assert run.code == 2 and "refusing to overwrite" in run.err
    assert digest(corpus.path) == before
    assert cli("--db", corpus.path, "export", "-o", tmp_path).code == 2  # a directory


# --- the database ----------------------------------------------------------------------------------


def test_default_database_comes_from_settings(
    cli: Any, corpus: Corpus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TASKAPP_TRACES_DB", str(corpus.path))
    assert len(cli("list", "--json").json()) == len(RUN_IDS)
    monkeypatch.delenv("TASKAPP_TRACES_DB")
    monkeypatch.chdir(tmp_path)
    run = cli("list")
    assert run.code == 2 and "traces/task_app.db" in run.err and "TASKAPP_TRACES_DB" in run.err
    assert not (tmp_path / "traces").exists()  # never created


def test_reading_never_writes(cli: Any, corpus: Corpus, tmp_path: Path) -> None:
    before = digest(corpus.path)
    for argv in (["list"], ["show", "alpha"], ["export", "-o", str(tmp_path / "x.jsonl")]):
        assert cli("--db", corpus.path, *argv).code == 0
    assert digest(corpus.path) == before


def test_unreadable_databases_exit_2_with_a_message(cli: Any, tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    folder = tmp_path / "no-databases"  # a folder is read as every database in it
    folder.mkdir()
    cases = {missing: "no trace database at", folder: "no trace databases (*.db) in"}
    text = tmp_path / "notes.txt"
    text.write_text("these are not traces\n" * 10)
    cases[text] = "is not an SQLite database"
    empty = tmp_path / "empty.db"
    empty.touch()
    cases[empty] = "(empty file)"
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE unrelated (x INTEGER)")
    conn.close()
    cases[other] = "not a trace database (no such table: session_traces)"
    for path, message in cases.items():
        for argv in (["list"], ["show", "x"], ["export", "-o", str(tmp_path / "out.jsonl")]):
            run = cli("--db", path, *argv)
            assert run.code == 2, (path, argv)
            assert run.err.startswith("error: ") and message in run.err, (path, argv, run.err)
            assert run.out == ""
    assert not missing.exists()
    assert not (tmp_path / "out.jsonl").exists()


# --- the installed command ------------------------------------------------------------------------


@pytest.mark.e2e
def test_wired_into_task_app_cli(corpus: Corpus, tmp_path: Path) -> None:
    """Needs `add_traces_parser(commands)` in task_app/cli/main.py `build_parser` (the lead's one-line change)."""
    command = [sys.executable, "-m", "task_app.cli.main", "traces"]
    helped = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert helped.returncode == 0, "task_app/cli/main.py does not register `traces` yet: " + helped.stderr
    assert all(name in helped.stdout for name in ("list", "show", "export"))

    env = {**os.environ, "TASKAPP_TRACES_DB": str(corpus.path), "TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"}
    output = tmp_path / "sft.jsonl"
    exported = subprocess.run(
        [*command, "export", "--format", "openai-sft", "-o", str(output)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert exported.returncode == 0, exported.stderr
    assert "exporting sessions" in exported.stderr  # the progress bar, on a terminal
    assert read_jsonl(output)

    listed = subprocess.run([*command, "list", "--json"], capture_output=True, text=True, timeout=60, env=env)
    assert listed.returncode == 0 and len(json.loads(listed.stdout)) == len(RUN_IDS)
    missing = subprocess.run(
        [*command, "--db", str(tmp_path / "nope.db"), "list"], capture_output=True, text=True, timeout=60
    )
    assert missing.returncode == 2 and "no trace database at" in missing.stderr
