"""Deterministic replay: real rollouts (deaths, resets, the decision cap) stored in a real TraceStore,
rebuilt from seed + settings + executed actions, and tampered traces caught at the right decision."""

from __future__ import annotations

import copy
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from support.policies import FakeLLMPolicy, RandomPolicy, ScriptedPolicy
from support.rollouts import NOOPS, deaths_rollout, llm_rollout, make_plan, run_rollout
from support.traces import load_session, run_cli, store_all

from task_app.game import WorldFactory
from task_app.inspection.replay import ReplayError, replay, run_from_response, run_from_trace
from task_app.rollout.result import RolloutResult
from task_app.tracing import build_session_trace

# --- fixtures -------------------------------------------------------------------------------------


def capped_rollout(worlds: WorldFactory, run_id: str = "capped") -> RolloutResult:
    """Env ops only (injected noops): 8 decisions against a cap of 4 per episode, so two truncated episodes."""
    plan = make_plan(
        run_id=run_id, env={"seed": 4}, policy={"config": {"max_llm_calls": 4}}, ops=["env"] * 8, on_done="reset"
    )
    return run_rollout(plan, ScriptedPolicy([["noop"]]), worlds)


def short_episodes_rollout(worlds: WorldFactory, run_id: str = "short") -> RolloutResult:
    """Episodes of 30 crafter steps (env.config.length), random moves: truncations mid-decision, resets."""
    plan = make_plan(
        run_id=run_id,
        env={"seed": 7, "config": {"length": 30}},
        policy={"config": {"max_llm_calls": 20}},
        ops=["agent", "env"] * 20,
        on_done="reset",
    )
    return run_rollout(plan, RandomPolicy(seed=7, actions=("move_left", "move_right", "move_up", "do")), worlds)


@pytest.fixture(scope="module")
def deaths(worlds: WorldFactory) -> RolloutResult:
    return deaths_rollout(worlds)


@pytest.fixture
def db(tmp_path: Path, deaths: RolloutResult) -> Path:
    return store_all(tmp_path / "traces.db", deaths)


def env_event(trace: dict[str, Any], decision: int) -> dict[str, Any]:
    step = trace["session_time_steps"][decision]
    return next(event for event in step["events"] if "reward" in event)


def tamper(db: Path, decision: int, column: str, value: Any) -> None:
    """Change one stored value of a decision's environment event, as a corrupted or edited trace would."""
    with sqlite3.connect(db) as conn:
        changed = conn.execute(
            f"UPDATE events SET {column} = ? WHERE event_type = 'environment' AND timestep_id = "
            "(SELECT id FROM session_timesteps WHERE session_id = 'deaths' AND step_index = ?)",
            (value, decision),
        ).rowcount
    assert changed == 1


# --- matching replays -----------------------------------------------------------------------------


def test_deaths_and_resets_replay_exactly(db: Path, deaths: RolloutResult, worlds: WorldFactory) -> None:
    episodes = deaths.episodes
    assert len(episodes) >= 3 and all(episode.terminated for episode in episodes[:-1])
    assert any(len(record.outcome.actions) < NOOPS for record in deaths.records)  # died mid-decision
    run = run_from_trace(load_session(db, "deaths"))
    assert run.assumed == []
    assert run.spec.on_done == "reset" and run.spec.seed == 1
    started = time.perf_counter()
    outcome = replay(run, worlds)
    assert outcome.ok, outcome.mismatch
    assert (outcome.checked, outcome.episodes) == (len(deaths.records), len(episodes))
    assert time.perf_counter() - started < 5


@pytest.mark.parametrize("make", [capped_rollout, short_episodes_rollout], ids=["decision-cap", "episode-length"])
def test_truncated_episodes_replay_exactly(make: Any, tmp_path: Path, worlds: WorldFactory) -> None:
    result = make(worlds)
    truncated = [episode for episode in result.episodes if episode.truncated]
    assert len(result.episodes) >= 2 and len(truncated) >= 2
    trace = load_session(store_all(tmp_path / "t.db", result), result.plan.run_id)
    outcome = replay(run_from_trace(trace), worlds)
    assert outcome.ok, outcome.mismatch
    assert outcome.episodes == len(result.episodes)


def test_the_decision_cap_matters(tmp_path: Path, worlds: WorldFactory) -> None:
    result = capped_rollout(worlds)
    trace = load_session(store_all(tmp_path / "t.db", result), "capped")
    assert trace["metadata"]["replay"]["max_steps_per_episode"] == 4
    trace["metadata"]["replay"]["max_steps_per_episode"] = None
    outcome = replay(run_from_trace(trace), worlds)
    assert outcome.mismatch is not None
    assert (outcome.mismatch.decision, outcome.mismatch.what) == (3, "truncated")
    assert outcome.checked == 3


def test_traces_without_replay_metadata_are_reconstructed(tmp_path: Path, worlds: WorldFactory) -> None:
    """Traces stored before `metadata.replay` existed: length, on_done and the cap come from the record."""
    for result in (deaths_rollout(worlds, "old-deaths", 6), capped_rollout(worlds, "old-capped")):
        trace = load_session(store_all(tmp_path / f"{result.plan.run_id}.db", result), result.plan.run_id)
        del trace["metadata"]["replay"]
        run = run_from_trace(trace)
        assert run.assumed == ["area", "length", "on_done", "max_steps_per_episode"]
        assert run.spec.max_steps_per_episode == (4 if result.plan.run_id == "old-capped" else None)
        outcome = replay(run, worlds)
        assert outcome.ok, outcome.mismatch


def test_llm_trace_replays_and_keeps_the_model_side(tmp_path: Path, worlds: WorldFactory) -> None:
    result = llm_rollout(worlds, run_id="llm", decisions=6, policy=FakeLLMPolicy(seed=2))
    run = run_from_trace(load_session(store_all(tmp_path / "t.db", result), "llm"))
    assert replay(run, worlds).ok
    first = run.decisions[0]
    assert first.source == "llm" and first.model == "fake-model-7b"
    assert first.latency_ms == 420 and (first.input_tokens, first.output_tokens) == (812, 24)
    assert first.tool_calls[0]["name"] == "interact_many"


def test_responses_replay_with_or_without_a_trace(deaths: RolloutResult, worlds: WorldFactory) -> None:
    from_steps = run_from_response(deaths.response())
    assert "area" in from_steps.assumed and from_steps.spec.length == 10_000
    assert replay(from_steps, worlds).ok
    structured = deaths.response(trace=build_session_trace(deaths))
    from_trace = run_from_response(structured)
    assert from_trace.assumed == []
    assert replay(from_trace, worlds).ok
    with pytest.raises(ReplayError, match="no trajectory"):
        run_from_response({"run_id": "x", "trajectories": []})


# --- tampered traces ------------------------------------------------------------------------------


def test_a_changed_reward_is_reported_at_its_decision(db: Path, worlds: WorldFactory) -> None:
    tamper(db, 4, "reward", 1.0)
    outcome = replay(run_from_trace(load_session(db, "deaths")), worlds)
    assert outcome.mismatch is not None and not outcome.ok
    assert (outcome.mismatch.decision, outcome.mismatch.what) == (4, "reward")
    assert outcome.checked == 4
    assert outcome.mismatch.diff() == ["trace:  1.0", "replay: 0.0"]


def test_a_changed_observation_is_reported_with_a_diff(db: Path, worlds: WorldFactory) -> None:
    trace = load_session(db, "deaths")
    text = env_event(trace, 5)["system_state_before"]["text"]
    edited = text.replace("Vitals: health", "Vitals: HEALTH", 1)
    assert edited != text
    tamper(db, 5, "system_state_before", json.dumps({"text": edited}))
    outcome = replay(run_from_trace(load_session(db, "deaths")), worlds)
    assert outcome.mismatch is not None
    assert (outcome.mismatch.decision, outcome.mismatch.what) == (5, "observation before the decision")
    diff = outcome.mismatch.diff()
    assert diff[:2] == ["--- trace", "+++ replay"]
    assert any(line.startswith("-Vitals: HEALTH") for line in diff)
    assert any(line.startswith("+Vitals: health") for line in diff)
    assert len(diff) <= 12


def test_a_changed_episode_end_is_reported(db: Path, worlds: WorldFactory) -> None:
    trace = load_session(db, "deaths")
    steps = range(len(trace["session_time_steps"]))
    death = next(index for index in steps if env_event(trace, index)["terminated"])
    env_event(trace, death)["terminated"] = False
    outcome = replay(run_from_trace(trace), worlds)
    assert outcome.mismatch is not None
    assert (outcome.mismatch.decision, outcome.mismatch.what) == (death, "terminated (the player died)")


def test_actions_recorded_past_a_death_are_reported(db: Path, worlds: WorldFactory) -> None:
    trace = load_session(db, "deaths")
    death = next(index for index in range(len(trace["session_time_steps"])) if env_event(trace, index)["terminated"])
    actions = env_event(trace, death)["metadata"]["actions"]
    actions += ["noop"] * 3
    outcome = replay(run_from_trace(trace), worlds)
    assert outcome.mismatch is not None and outcome.mismatch.decision == death
    assert outcome.mismatch.what.startswith("number of executed actions")
    assert (outcome.mismatch.trace, outcome.mismatch.replay) == (len(actions), len(actions) - 3)


def test_missing_actions_make_the_trace_unreplayable(db: Path, worlds: WorldFactory) -> None:
    trace = copy.deepcopy(load_session(db, "deaths"))
    del env_event(trace, 2)["metadata"]["actions"]
    outcome = replay(run_from_trace(trace), worlds)
    assert outcome.mismatch is None and not outcome.ok
    assert outcome.incomplete is not None and "decision 2" in outcome.incomplete
    assert outcome.checked == 2


# --- the command --------------------------------------------------------------------------------


def test_replay_command(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["replay", "deaths", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "OK: 10 decision(s) in" in out and "seed 1, area 64x64" in out
    assert run_cli(["replay", "deaths", "--db", str(db), "--json"]) == 0
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["ok"] is True and verdict["spec"]["on_done"] == "reset" and verdict["mismatch"] is None

    tamper(db, 6, "reward", 3.0)
    assert run_cli(["replay", "deaths", "--db", str(db)]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH at decision 6" in out and "reward" in out and "trace:  3.0" in out
    assert run_cli(["replay", "deaths", "--db", str(db), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["mismatch"]["decision"] == 6


def test_replay_command_failures(db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["replay", "nope", "--db", str(db)]) == 2
    assert "no run 'nope'" in capsys.readouterr().err
    assert run_cli(["replay", "deaths", "--db", str(tmp_path / "missing.db")]) == 2
    assert "no trace database" in capsys.readouterr().err
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all" * 100)
    assert run_cli(["replay", "deaths", "--db", str(junk)]) == 2
    assert "error:" in capsys.readouterr().err
