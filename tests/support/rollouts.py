"""The one request builder and rollouts run in-process through the real engine and crafter."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import uuid
from pathlib import Path
from typing import Any

import httpx

from task_app.core.contracts import RolloutRequest, RolloutResponse
from task_app.core.settings import Settings
from task_app.game import WorldFactory
from task_app.rollout.control import RunControl
from task_app.rollout.engine import RolloutEngine
from task_app.rollout.plan import RolloutPlan, build_plan
from task_app.rollout.result import RolloutResult

from .policies import INFERENCE_URL, MODEL, FakeLLMPolicy, ScriptedPolicy

SAMPLES = Path(__file__).resolve().parent.parent / "samples"


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def new_run_id(prefix: str = "test") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def request_body(*, decisions: int | None = None, inference_url: str | None = None, **overrides: Any) -> dict[str, Any]:
    """The one request builder: a valid eval request with a fresh run_id; nested dicts in `overrides`
    are merged in.

    By default the built-in scripted policy and 10 decisions. With `inference_url`: crafter-react
    against that model server (the loopback fake model), model "fake-model" and `max_llm_calls` =
    `decisions` (default 1). `decisions` sets `ops` to that many agent/env pairs.
    """
    base: dict[str, Any] = {
        "run_id": new_run_id(),
        "mode": "eval",
        "env": {"env_name": "crafter", "seed": 1, "config": {}},
        "policy": {"policy_name": "crafter-scripted", "config": {}},
        "ops": ["agent", "env"] * 10,
    }
    if inference_url is not None:
        decisions = 1 if decisions is None else decisions
        base["policy"] = {
            "policy_name": "crafter-react",
            "config": {"model": "fake-model", "inference_url": inference_url, "max_llm_calls": decisions},
        }
    if decisions is not None:
        base["ops"] = ["agent", "env"] * decisions
    return _merge(base, overrides)


def make_plan(settings: Settings | None = None, **overrides: Any) -> RolloutPlan:
    return build_plan(RolloutRequest.model_validate(request_body(**overrides)), settings or Settings())


def run_rollout(plan: RolloutPlan, policy: Any, worlds: Any, control: RunControl | None = None) -> RolloutResult:
    return asyncio.run(RolloutEngine(plan, policy, worlds, control=control).run())


def trajectory_key(result: RolloutResult) -> list[tuple[Any, ...]]:
    """What two rollouts must share to be 'the same trajectory' (timings excluded)."""
    return [
        (
            record.episode,
            record.obs_text,
            tuple(record.outcome.actions),
            record.outcome.unlocked,
            record.reward,
            record.done,
            record.obs_after_text,
        )
        for record in result.records
    ]


async def run_llm_rollout(
    worlds: WorldFactory,
    *,
    run_id: str = "trace-run",
    decisions: int = 5,
    seed: int = 3,
    policy: FakeLLMPolicy | None = None,
    ops: list[str] | None = None,
    step_rewards: dict[str, Any] | None = None,
) -> RolloutResult:
    """A rollout of `FakeLLMPolicy` through the real engine and crafter (a compact trace requested)."""
    config: dict[str, Any] = {"model": MODEL, "inference_url": INFERENCE_URL, "max_llm_calls": decisions}
    if step_rewards:
        config["step_rewards"] = step_rewards
    body = request_body(
        run_id=run_id,
        env={"seed": seed},
        policy={"policy_name": "crafter-react", "config": config},
        ops=ops or ["agent", "env"] * decisions,
        record={"return_trace": True, "trace_format": "compact"},
    )
    plan = build_plan(RolloutRequest.model_validate(body), Settings())
    return await RolloutEngine(plan, policy or FakeLLMPolicy(seed=seed), worlds).run()


def llm_rollout(worlds: WorldFactory, **kwargs: Any) -> RolloutResult:
    return asyncio.run(run_llm_rollout(worlds, **kwargs))


def with_run_id(result: RolloutResult, run_id: str) -> RolloutResult:
    return dataclasses.replace(result, plan=dataclasses.replace(result.plan, run_id=run_id))


# --- trace databases and the commands that read them ---------------------------------------------------

NOOPS = 64  # a decision of 64 noops: an idle player dies within about three decisions


def deaths_rollout(worlds: WorldFactory, run_id: str = "deaths", decisions: int = 10) -> RolloutResult:
    """Seed 1, an idle player: it dies in its third decision (mid-decision), and on_done resets the world."""
    plan = make_plan(
        Settings(max_actions_per_decision=NOOPS),
        run_id=run_id,
        env={"seed": 1},
        policy={"config": {"max_llm_calls": decisions}},
        ops=["agent", "env"] * decisions,
        on_done="reset",
    )
    return run_rollout(plan, ScriptedPolicy([["noop"] * NOOPS]), worlds)


def post_rollout(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    """POST /rollout, expect 200 and a body that validates as a RolloutResponse; return the body."""
    response = client.post("/rollout", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    RolloutResponse.model_validate(result)
    return result
