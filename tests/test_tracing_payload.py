"""Trace payloads (docs/contract.md, "Trace payload"): compact / structured / full built from real rollouts of
`helpers.FakeLLMPolicy` through the real RolloutEngine and real crafter."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timedelta
from typing import Any

import pytest
from helpers import MODEL, SAMPLES, SYSTEM_PROMPT, FakeLLMPolicy, llm_rollout

from task_app.game import WorldFactory
from task_app.rollout.result import RolloutResult
from task_app.tracing import build_compact_trace, build_session_trace, build_trace_payload, outcome_reward
from task_app.tracing.rewards import event_rewards

ISO_KEYS = {"created_at", "timestamp", "completed_at", "started_at", "finished_at"}


def iso_values(value: Any, key: str = "") -> list[tuple[str, Any]]:
    """Every (key, value) under a timestamp-like key, at any depth."""
    found = []
    if isinstance(value, dict):
        for child_key, child in value.items():
            if child_key in ISO_KEYS and not isinstance(child, dict | list):
                found.append((child_key, child))
            found.extend(iso_values(child, child_key))
    elif isinstance(value, list):
        for child in value:
            found.extend(iso_values(child, key))
    return found


def assert_iso_utc(pairs: list[tuple[str, Any]]) -> None:
    assert pairs
    for key, value in pairs:
        if value is None:
            continue
        assert isinstance(value, str), (key, value)
        parsed = datetime.fromisoformat(value)
        assert parsed.utcoffset() == timedelta(0), (key, value)


def sample_trace_shape() -> dict[str, Any]:
    return json.loads((SAMPLES / "rollout_response_rl_10steps.shape.json").read_text())["trace"]


# --- tests -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def result(worlds: WorldFactory) -> RolloutResult:
    return llm_rollout(worlds, run_id="payload-run", decisions=6)


def test_structured_trace_has_the_seed_shape(result: RolloutResult) -> None:
    trace = build_trace_payload(result, "structured")
    shape = sample_trace_shape()
    assert set(trace) == set(shape)
    assert trace["session_id"] == "payload-run"
    steps = trace["session_time_steps"]
    assert len(steps) == 6
    step_shape = shape["session_time_steps"][1]
    for index, step in enumerate(steps):
        assert set(step) == set(step_shape)
        assert (step["step_id"], step["step_index"], step["turn_number"]) == (f"decision_{index}", index, index)
        assert len(step["events"]) == 2
        messages = step["markov_blanket_messages"]
        assert [message["message_type"] for message in messages] == ["system", "user", "assistant", "assistant"]
        assert messages[-1]["metadata"] == {"turn": index, "step_id": f"decision_{index}", "is_tool_call": True}
    lm_event, env_event = steps[0]["events"]
    assert set(lm_event) == set(shape["event_history"][1])
    assert len(lm_event["call_records"][0]) == 34
    assert lm_event["system_instance_id"] == "policy:crafter-react"
    assert (lm_event["model_name"], lm_event["provider"]) == (MODEL, "openai")
    assert (lm_event["input_tokens"], lm_event["output_tokens"], lm_event["total_tokens"]) == (812, 24, 836)
    assert lm_event["latency_ms"] == 420
    assert env_event["system_instance_id"] == "environment:crafter"
    assert env_event["system_state_before"] == {"text": result.records[0].obs_text}
    assert env_event["system_state_after"] == {"text": result.records[0].obs_after_text}
    assert isinstance(env_event["reward"], float) and env_event["terminated"] is False
    message = steps[0]["markov_blanket_messages"][1]
    assert set(message) == set(shape["markov_blanket_message_history"][1])
    assert set(message["content"]) == {"text", "json_payload"}
    assert json.loads(message["content"]["json_payload"])["text"] == message["content"]["text"]
    assert len(trace["event_history"]) == 12 and len(trace["markov_blanket_message_history"]) == 24
    assert set(shape["metadata"]) <= set(trace["metadata"])
    json.dumps(trace, allow_nan=False)


def test_timestamps_are_iso_utc_and_event_times_are_epoch_floats(result: RolloutResult) -> None:
    for trace_format in ("compact", "structured", "full"):
        trace = build_trace_payload(result, trace_format)
        assert_iso_utc(iso_values(trace))
        assert "datetime.datetime(" not in json.dumps(trace)
    trace = build_session_trace(result)
    for item in trace["event_history"] + trace["markov_blanket_message_history"]:
        assert isinstance(item["time_record"]["event_time"], float)
        assert item["time_record"]["message_time"] == item["metadata"]["turn"]


def test_call_record_keeps_prompt_and_answer_but_not_the_query_string(result: RolloutResult) -> None:
    record = build_session_trace(result)["event_history"][0]["call_records"][0]
    assert record["call_id"] == "payload-run:decision_0"
    assert [m["role"] for m in record["input_messages"]] == ["system", "user"]
    assert record["input_messages"][0]["parts"] == [{"type": "text", "text": SYSTEM_PROMPT}]
    assert record["output_tool_calls"][0]["name"] == "interact_many"
    assert record["output_tool_calls"][0]["arguments"]["actions"] == result.records[0].outcome.actions
    assert record["tool_choice"] == "interact_many"
    assert record["request_params"]["tool_config"]["tools"] == ["interact_many"]
    assert record["metadata"]["url"] == "http://127.0.0.1:9/v1/chat/completions"
    assert record["trace_id"] == "trace_fake_cid"
    assert record["tool_results"][0]["status"] == "ok"
    assert record["response_raw_json"] is None
    full = build_session_trace(result, "full")["event_history"][0]["call_records"][0]
    assert json.loads(full["response_raw_json"])["id"] == "chatcmpl-0"


def test_compact_trace(result: RolloutResult) -> None:
    compact = build_trace_payload(result, "compact")
    assert set(compact) == {
        "session_id",
        "created_at",
        "metadata",
        "events_count",
        "messages_count",
        "lm_calls",
        "decision_rewards",
    }
    structured = build_session_trace(result)
    assert compact["events_count"] == len(structured["event_history"])
    assert compact["messages_count"] == len(structured["markov_blanket_message_history"])
    assert [call["turn"] for call in compact["lm_calls"]] == list(range(6))
    assert set(compact["lm_calls"][0]) == {
        "turn",
        "model",
        "provider",
        "total_tokens",
        "input_tokens",
        "output_tokens",
        "latency_ms",
        "tool_calls",
    }
    assert [entry["turn"] for entry in compact["decision_rewards"]] == list(range(6))
    assert set(compact["decision_rewards"][0]) == {
        "turn",
        "ach_delta",
        "unique_delta",
        "achievements",
        "unique_achievements",
    }
    text = json.dumps(compact)
    assert SYSTEM_PROMPT[:60] not in text and result.records[0].obs_text not in text


def test_images_only_in_full_traces(worlds: WorldFactory) -> None:
    result = llm_rollout(worlds, run_id="image-run", decisions=2, policy=FakeLLMPolicy(image=True))
    user = result.records[0].decision.lm_call.messages[1]["content"]  # type: ignore[union-attr]
    data = user[1]["image_url"]["url"].split(",", 1)[1]
    full = json.dumps(build_trace_payload(result, "full"))
    assert data in full
    for trace_format in ("structured", "compact"):
        assert data not in json.dumps(build_trace_payload(result, trace_format))
    structured = build_session_trace(result)
    part = structured["event_history"][0]["call_records"][0]["input_messages"][1]["parts"][1]
    assert part["type"] == "image" and part["mime_type"] == "image/png" and len(part["sha256"]) == 64
    assert "base64_data" not in part
    payload = json.loads(structured["markov_blanket_message_history"][1]["content"]["json_payload"])
    assert payload["content"][1]["type"] == "image_ref"


def test_decision_rewards_and_event_rewards_are_zero_based_and_never_zero(result: RolloutResult) -> None:
    assert all(event_rewards(record) == [] for record in result.records if not record.outcome.unlocked)
    record = result.records[2]
    unlocking = dataclasses.replace(record, outcome=dataclasses.replace(record.outcome, unlocked=("collect_wood",)))
    rewards = event_rewards(unlocking)
    assert [(r["reward_type"], r["reward_value"], r["turn_number"]) for r in rewards] == [
        ("achievement_delta", 1.0, 2),
        ("unique_achievement_delta", 1.0, 2),
    ]
    assert rewards[0]["annotation"] == {"achievements": ["collect_wood"]}


def test_step_rewards_flow_into_trace(worlds: WorldFactory) -> None:
    shaping = {"enabled": True, "mode": "decision_stepwise", "strategy": "per_achievement"}
    result = llm_rollout(worlds, run_id="shaped", decisions=4, step_rewards=shaping)
    compact = build_compact_trace(result)
    for record, entry in zip(result.records, compact["decision_rewards"], strict=True):
        assert record.stepwise is not None
        assert entry["turn"] == record.index == record.stepwise.decision_rewards["turn"]
    trace = build_session_trace(result)
    assert trace["session_metadata"]["stepwise"] == result.stepwise_summary


def test_outcome_reward_is_a_float(result: RolloutResult) -> None:
    copy = dataclasses.replace(result, episodes=[dataclasses.replace(result.episodes[0], episode_return=1.5)])
    outcome = outcome_reward(copy)
    assert outcome == {"total_reward": 1.5, "achievements_count": len(copy.final_achievements), "total_steps": 6}
    assert build_session_trace(copy)["metadata"]["outcome_reward"]["total_reward"] == 1.5


def test_scripted_decisions_injected_noops_and_failed_calls(worlds: WorldFactory) -> None:
    scripted = llm_rollout(worlds, run_id="scripted", decisions=2, policy=FakeLLMPolicy(lm=False))
    trace = build_session_trace(scripted)
    assert [len(step["events"]) for step in trace["session_time_steps"]] == [1, 1]
    messages = trace["session_time_steps"][0]["markov_blanket_messages"]
    assert [message["message_type"] for message in messages] == ["user", "assistant"]
    assert build_compact_trace(scripted)["lm_calls"] == []

    noop_first = llm_rollout(worlds, run_id="noop", decisions=2, ops=["env", "agent", "env"])
    step = build_session_trace(noop_first)["session_time_steps"][0]
    assert len(step["events"]) == 1 and step["markov_blanket_messages"] == []
    assert step["events"][0]["metadata"]["injected_noop"] is True

    failing = llm_rollout(worlds, run_id="failing", decisions=2, policy=FakeLLMPolicy(fail_turns=[0]))
    step = build_session_trace(failing)["session_time_steps"][0]
    record = step["events"][0]["call_records"][0]
    assert record["outcome"] == "error" and record["error"]["message"].startswith("ReadTimeout")
    assert [m["message_type"] for m in step["markov_blanket_messages"]] == ["system", "user"]
    assert step["events"][0]["metadata"]["usable"] is False


def test_unknown_format_is_rejected(result: RolloutResult) -> None:
    with pytest.raises(ValueError, match="format"):
        build_trace_payload(result, "verbose")


def test_compact_response_of_50_decisions_stays_small(worlds: WorldFactory) -> None:
    result = llm_rollout(worlds, run_id="big-run", decisions=50)
    assert len(result.records) == 50
    prompt = result.records[0].decision.lm_call.messages  # type: ignore[union-attr]
    assert len(json.dumps(prompt)) > 2500  # the fake prompts resemble real ones
    body = json.dumps(result.response(build_trace_payload(result, "compact")))
    assert len(body) < 150_000, len(body)
