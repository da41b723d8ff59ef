"""build_plan: every default, alias, cap and client mistake of a RolloutRequest (docs/contract.md,
"The rollout request")."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import make_plan, request_body

from task_app.core.contracts import RolloutRequest
from task_app.core.errors import InvalidRequest, TaskAppError, UnknownName
from task_app.core.settings import MAX_SEED, Settings
from task_app.core.tasks import EVAL_FIRST_SEED
from task_app.rollout.plan import POLICY_NAMES, build_plan, seed_from_run_id

REACT = {"policy_name": "crafter-react", "config": {"model": "m", "inference_url": "http://127.0.0.1:9/v1"}}


def _error(settings: Settings | None = None, **overrides: Any) -> TaskAppError:
    with pytest.raises(InvalidRequest) as caught:
        make_plan(settings, **overrides)
    assert caught.value.status == 422
    return caught.value


# --- defaults -------------------------------------------------------------------------------------


def test_defaults() -> None:
    plan = make_plan(run_id="test-run")
    assert (plan.run_id, plan.mode, plan.env_name, plan.policy_name) == (
        "test-run",
        "eval",
        "crafter",
        "crafter-scripted",
    )
    assert (plan.seed, plan.area, plan.length, plan.difficulty) == (1, (64, 64), 10_000, None)
    assert plan.ops == ("agent", "env") * 10 and plan.ops_dropped == 0
    assert (plan.decision_cap, plan.max_steps_per_episode) == (10, 10)
    assert (plan.on_done, plan.max_ops, plan.max_time_s, plan.max_actions) == ("reset", 100_000, 3600.0, 8)
    assert plan.image_size is None
    assert plan.step_rewards.active is False
    assert plan.trace_correlation_id == "trace_test-run"
    assert plan.inference_url is None
    assert (plan.return_trace, plan.trace_format, plan.record_trajectories) == (False, "compact", True)
    assert (plan.training_session_id, plan.synth_base_url, plan.alias_applied) == (None, None, False)
    assert (plan.policy.temperature, plan.policy.top_p) == (0.2, 0.95)


def test_request_fields_are_carried() -> None:
    plan = make_plan(
        on_done="terminate",
        safety={"max_ops": 7, "max_time_s": 12.5},
        record={"return_trace": True, "trace_format": "structured", "trajectories": False},
        training_session_id="ts-1",
        synth_base_url="http://synth.example",
        env={"config": {"area": [32, 48], "length": 500, "difficulty": "hard"}},
    )
    assert (plan.on_done, plan.max_ops, plan.max_time_s) == ("terminate", 7, 12.5)
    assert (plan.return_trace, plan.trace_format, plan.record_trajectories) == (True, "structured", False)
    assert (plan.training_session_id, plan.synth_base_url) == ("ts-1", "http://synth.example")
    assert (plan.area, plan.length, plan.difficulty) == ((32, 48), 500, "hard")


def test_settings_bound_the_deadline_and_give_world_defaults() -> None:
    settings = Settings(max_time_s=60, area=(48, 48), episode_length=777, max_actions_per_decision=4)
    plan = make_plan(settings, safety={"max_time_s": 10_000})
    assert (plan.max_time_s, plan.area, plan.length, plan.max_actions) == (60, (48, 48), 777, 4)


@pytest.mark.parametrize("area", [[4, 64], [64, 1000]])
def test_area_out_of_bounds(area: list[int]) -> None:
    assert _error(env={"config": {"area": area}}).code == "invalid_env_config"


@pytest.mark.parametrize(
    ("config", "size"),
    [
        ({}, None),
        ({"use_vision": True}, 64),
        ({"image_only_mode": True}, 64),
        ({"use_vision": True, "image_size": 128}, 128),
    ],
)
def test_image_only_when_vision_is_on(config: dict[str, Any], size: int | None) -> None:
    assert make_plan(policy={"config": config}).image_size == size


# --- ops ------------------------------------------------------------------------------------------


def test_op_aliases() -> None:
    ops = ["policy", "model", "environment", "step", "AGENT", " Env "]
    assert make_plan(ops=ops).ops == ("agent", "agent", "env", "env", "agent", "env")


def test_dict_ops_use_type_or_op() -> None:
    ops = [{"type": "policy"}, {"op": "step"}, {"type": "agent", "extra": 1}, {"op": "ENV"}]
    assert make_plan(ops=ops).ops == ("agent", "env", "agent", "env")


@pytest.mark.parametrize(
    ("ops", "index", "problem"),
    [
        (["agent", "jump"], 1, "unknown op 'jump'"),
        (["agent", {"kind": "env"}], 1, "an op object needs a string 'type' (or 'op')"),
        ([{"type": "reset"}], 0, "unknown op 'reset'"),
        ([{"type": 5}], 0, "an op object needs a string 'type' (or 'op')"),
        (["env", None], 1, "an op is a string or an object, not null"),
        (["agent", "env", 1, "fly"], 2, "an op is a string or an object, not a number"),
        (["agent", {"type": "env"}, ["agent"]], 2, "an op is a string or an object, not an array"),
        (["agent", "x" * 500], 1, "unknown op '" + "x" * 60 + "...'"),
    ],
)
def test_invalid_op(ops: list[Any], index: int, problem: str) -> None:
    """The first bad op, by index, in JSON's words (never Python's None), its text cut short."""
    error = _error(ops=ops)
    assert error.code == "invalid_op"
    assert (
        error.message == f"ops[{index}]: {problem}; use 'agent' or 'env' (aliases: policy, model / environment, step)"
    )
    assert error.details["index"] == index


def test_empty_ops() -> None:
    assert _error(ops=[]).code == "empty_ops"


@pytest.mark.parametrize("form", ["strings", "objects"])
def test_a_list_of_any_length_is_accepted_and_truncated(form: str) -> None:
    """The seed's trainers may send `["agent", "env"] * 50000` (safety.max_ops is 100000) and rely on the
    truncation to 2 x max_llm_calls; ops beyond it are checked all the same."""
    ops: list[Any] = ["agent", "env"] * 50_000 if form == "strings" else [{"type": "agent"}, {"op": "env"}] * 50_000
    plan = make_plan(ops=ops, policy={"config": {"max_llm_calls": 10}})
    assert (plan.ops, plan.ops_dropped, plan.max_ops) == (("agent", "env") * 10, 99_980, 100_000)
    assert _error(ops=[*ops, "fly"]).message.startswith("ops[100000]: unknown op 'fly'")


def test_ops_truncated_to_twice_the_decision_cap() -> None:
    plan = make_plan(policy={"config": {"max_llm_calls": 3}}, ops=["agent", "env"] * 10)
    assert plan.ops == ("agent", "env") * 3
    assert plan.ops_dropped == 14
    assert make_plan(policy={"config": {"max_llm_calls": 3}}, ops=["env"] * 6).ops_dropped == 0


# --- the decision cap -----------------------------------------------------------------------------


@pytest.mark.parametrize("cap", [0, -1, "5", "ten", 2.5, True, None])
def test_bad_max_llm_calls_is_422(cap: Any) -> None:
    error = _error(policy={"config": {"max_llm_calls": cap}})
    assert error.code == "invalid_policy_config"
    assert "max_llm_calls" in error.message


def test_max_llm_calls_above_the_server_limit() -> None:
    assert _error(Settings(max_decisions=50), policy={"config": {"max_llm_calls": 51}}).code == "invalid_policy_config"


@pytest.mark.parametrize(("cap", "asked", "expected"), [(10, 3, 10), (10, None, 10), (10, 50, 50), (25, 20, 25)])
def test_max_steps_per_episode_is_at_least_the_cap(cap: int, asked: int | None, expected: int) -> None:
    env_params = {} if asked is None else {"max_steps_per_episode": asked}
    plan = make_plan(policy={"config": {"max_llm_calls": cap}}, env={"config": {"env_params": env_params}})
    assert (plan.decision_cap, plan.max_steps_per_episode) == (cap, expected)


@pytest.mark.parametrize("steps", [0, -3, "20"])
def test_bad_max_steps_per_episode(steps: Any) -> None:
    error = _error(env={"config": {"env_params": {"max_steps_per_episode": steps}}})
    assert error.code == "invalid_env_config"


# --- seeds and names ------------------------------------------------------------------------------


def test_null_seed_is_stable_per_run_id() -> None:
    first = make_plan(run_id="run-a", env={"seed": None}).seed
    assert make_plan(run_id="run-a", env={"seed": None}).seed == first
    others = {make_plan(run_id=f"run-{i}", env={"seed": None}).seed for i in range(8)}
    assert len(others) == 8
    assert first == seed_from_run_id("run-a", EVAL_FIRST_SEED - 1)  # a train world
    assert all(0 <= seed <= MAX_SEED for seed in others)
    assert first != 0


def test_null_seed_respects_max_seed() -> None:
    settings = Settings(max_seed=9)
    assert all(0 <= make_plan(settings, run_id=f"r{i}", env={"seed": None}).seed <= 9 for i in range(20))


@pytest.mark.parametrize(("seed", "settings"), [(-1, Settings()), (2**31, Settings()), (101, Settings(max_seed=100))])
def test_seed_out_of_range(seed: int, settings: Settings) -> None:
    assert _error(settings, env={"seed": seed}).code == "seed_out_of_range"


def test_seed_at_the_bounds() -> None:
    assert make_plan(env={"seed": 0}).seed == 0
    assert make_plan(env={"seed": MAX_SEED}).seed == MAX_SEED


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"env_name": "Minecraft"}, "unknown env_name 'Minecraft'"),
        ({"env_name": None}, "env.env_name (or env.env_id) is missing"),
        ({"env_name": ""}, "env.env_name (or env.env_id) is missing"),
    ],
)
def test_unknown_env(env: dict[str, Any], problem: str) -> None:
    with pytest.raises(UnknownName) as caught:
        make_plan(env=env)
    assert caught.value.code == "unknown_env" and caught.value.status == 422
    assert caught.value.message == f"{problem}; this app serves 'crafter'"


def test_env_by_id_and_any_case() -> None:
    assert make_plan(env={"env_name": None, "env_id": "crafter"}).env_name == "crafter"
    assert make_plan(env={"env_name": " Crafter "}).env_name == "crafter"


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("crafter-gpt", "unknown policy_name 'crafter-gpt'"),
        (None, "policy.policy_name (or policy.policy_id) is missing"),
        ("  ", "policy.policy_name (or policy.policy_id) is missing"),
        ("scripted", "unknown policy_name 'scripted'"),
    ],
)
def test_unknown_policy_lists_every_accepted_name(name: str | None, problem: str) -> None:
    with pytest.raises(UnknownName) as caught:
        make_plan(policy={"policy_name": name})
    assert caught.value.code == "unknown_policy" and caught.value.status == 422
    message = caught.value.message
    assert message.startswith(problem + "; use ")
    assert all(f"'{accepted}'" in message for accepted in POLICY_NAMES)
    assert "'math'" in message  # the seed's math* names are remapped (TASKAPP_MATH_ALIAS_ENABLED)
    assert "'math'" not in _error(Settings(math_alias_enabled=False), policy={"policy_name": name}).message


@pytest.mark.parametrize(
    ("name", "expected"), [("crafter", "crafter-react"), ("Crafter-React", "crafter-react"), ("react", "crafter-react")]
)
def test_policy_name_aliases(name: str, expected: str) -> None:
    assert make_plan(policy={**REACT, "policy_name": name}).policy_name == expected


# --- crafter-react and its inference URL ----------------------------------------------------------


def test_react_needs_a_model() -> None:
    error = _error(policy={"policy_name": "crafter-react", "config": {"inference_url": "http://127.0.0.1:9/v1"}})
    assert error.code == "missing_model"


def test_react_needs_an_inference_url_or_provider() -> None:
    assert _error(policy={"policy_name": "crafter-react", "config": {"model": "m"}}).code == "missing_inference_url"
    plan = make_plan(policy={"policy_name": "crafter-react", "config": {"model": "m", "provider": "groq"}})
    assert plan.policy.provider == "groq"
    assert plan.inference_url == "https://api.groq.com/openai/v1/chat/completions"  # the URL the policy calls


def test_react_with_everything() -> None:
    plan = make_plan(policy=REACT)
    assert plan.policy_name == "crafter-react"
    assert plan.inference_url == "http://127.0.0.1:9/v1/chat/completions"
    assert plan.policy.model == "m"


def test_inference_url_is_the_called_url_with_its_query() -> None:
    """What the response reports (pipeline_metadata, each step's info.meta): the URL the policy calls."""
    config = {"model": "m", "inference_url": "http://127.0.0.1:9/v1?cid=trace_abc"}
    plan = make_plan(policy={"policy_name": "crafter-react", "config": config})
    assert plan.inference_url == "http://127.0.0.1:9/v1/chat/completions?cid=trace_abc"
    scripted = make_plan(policy={"policy_name": "crafter-scripted", "config": config})
    assert scripted.inference_url is None  # the built-in policy calls no model, whatever the config says


@pytest.mark.parametrize(
    "url",
    [
        "ftp://host/v1",
        "127.0.0.1:8000/v1",
        "file:///etc/passwd",
        "http://",
        "http://user:secret@host/v1",
        "https://key@host/v1",
    ],
)
@pytest.mark.parametrize("policy_name", ["crafter-react", "crafter-scripted"])
def test_bad_inference_url(url: str, policy_name: str) -> None:
    error = _error(policy={"policy_name": policy_name, "config": {"model": "m", "inference_url": url}})
    assert error.code == "invalid_inference_url"
    assert "secret" not in error.message


def test_inference_host_allow_list() -> None:
    settings = Settings(inference_allowed_hosts=["127.0.0.1"])
    assert make_plan(settings, policy=REACT).inference_url == "http://127.0.0.1:9/v1/chat/completions"
    policy = {"policy_name": "crafter-react", "config": {"model": "m", "inference_url": "https://elsewhere.example/v1"}}
    assert _error(settings, policy=policy).code == "inference_host_not_allowed"


# --- trace correlation id -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            {"trace_correlation_id": "trace_a", "trace": "trace_b", "inference_url": "http://h/v1?cid=trace_c"},
            "trace_a",
        ),
        ({"trace": "trace_b", "inference_url": "http://h/v1?cid=trace_c"}, "trace_b"),
        ({"trace_correlation_id": "  ", "trace": " trace_b "}, "trace_b"),
        ({"inference_url": "http://h/v1/chat/completions?cid=trace_c"}, "trace_c"),
        ({"inference_url": "http://h/v1?trace=trace_d"}, "trace_d"),
        ({"inference_url": "http://h/v1?trace_correlation_id=trace_e"}, "trace_e"),
        ({"inference_url": "http://h/v1?x=1&cid=&trace=trace_f"}, "trace_f"),
    ],
)
@pytest.mark.parametrize("mode", ["rl", "eval"])
def test_trace_correlation_id_sources(config: dict[str, str], expected: str, mode: str) -> None:
    assert make_plan(mode=mode, policy={"config": config}).trace_correlation_id == expected


def test_rl_without_trace_correlation_id() -> None:
    error = _error(mode="rl", policy={"config": {"inference_url": "http://h/v1?other=1"}})
    assert error.code == "missing_trace_correlation_id"


def test_eval_defaults_to_trace_run_id() -> None:
    assert make_plan(mode="eval", run_id="r.1:x").trace_correlation_id == "trace_r.1:x"


def test_rl_sample_request_from_the_seed_trainer() -> None:
    body = request_body(
        run_id="drive-rl-1",
        mode="rl",
        env={"config": {"env_params": {"max_steps_per_episode": 10}}, "seed": 1},
        policy={
            "policy_name": "crafter-react",
            "config": {
                "inference_url": "http://127.0.0.1:8930/v1/chat/completions?cid=trace_drive_rl_1",
                "model": "mock-model",
                "max_llm_calls": 10,
            },
        },
        record={"return_trace": True, "trace_format": "structured"},
    )
    plan = build_plan(RolloutRequest.model_validate(body), Settings())
    assert plan.trace_correlation_id == "trace_drive_rl_1"
    assert plan.ops == ("agent", "env") * 10


# --- step rewards ---------------------------------------------------------------------------------


def test_step_rewards_from_policy_config_first_then_env_config() -> None:
    on = {"enabled": True, "mode": "decision_stepwise", "strategy": "per_achievement"}
    off = {"enabled": False}
    plan = make_plan(policy={"config": {"step_rewards": on}}, env={"config": {"step_rewards": off}})
    assert plan.step_rewards.active and plan.step_rewards.strategy == "per_achievement"
    plan = make_plan(env={"config": {"step_rewards": on}})
    assert plan.step_rewards.active


def test_bad_step_rewards() -> None:
    bad = {"enabled": True, "mode": "decision_stepwise", "weights": {"collect_wood": "lots"}}
    assert _error(policy={"config": {"step_rewards": bad}}).code == "invalid_step_rewards"


# --- the math alias -------------------------------------------------------------------------------


def test_math_alias_remaps_to_crafter() -> None:
    plan = make_plan(
        env={"env_name": "math"},
        policy={"policy_name": "math-single-step", "config": {"model": "m", "inference_url": "http://h/v1"}},
        ops=["agent", "env"],
    )
    assert plan.alias_applied is True
    assert (plan.env_name, plan.policy_name) == ("crafter", "crafter-react")
    assert plan.ops == ("agent", "env") * 10  # fewer than 20 ops: the seed's default
    assert plan.step_rewards.active and plan.step_rewards.lambda_effective == 1.0
    assert (plan.decision_cap, plan.max_steps_per_episode, plan.difficulty) == (10, 200, "normal")


def test_math_alias_keeps_the_callers_settings() -> None:
    plan = make_plan(
        env={"env_name": "MATH", "config": {"env_params": {"max_steps_per_episode": 30}}},
        policy={**REACT, "config": {**REACT["config"], "max_llm_calls": 15}},
        ops=["agent", "env"] * 12,
    )
    assert plan.alias_applied and plan.ops == ("agent", "env") * 12
    assert (plan.decision_cap, plan.max_steps_per_episode) == (15, 30)


def test_math_alias_can_be_disabled() -> None:
    with pytest.raises(UnknownName) as caught:
        make_plan(Settings(math_alias_enabled=False), env={"env_name": "math"}, policy=REACT)
    assert caught.value.code == "unknown_env"


def test_no_alias_for_crafter() -> None:
    assert make_plan(policy=REACT).alias_applied is False
