"""synth-ai 0.2.x (the seed system's package) as the client: its own models, its TaskAppClient, its RL-mode
validation and its `synth-ai smoke` command, against a real server and the loopback fake model.

`synth-ai smoke` runs as the user runs it (the console script, in a child process) with its own mock off
and `--inference-url` pointing at the fake model; a `sitecustomize` guard in the child refuses and
records any connection beyond loopback, as the suite's guard does in this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.fake_model import DEFAULT_USAGE, FakeModel, tool_call
from support.keys import TEST_KEY
from support.servers import AppServer
from synth_ai.task.client import TaskAppClient
from synth_ai.task.contracts import (
    RolloutEnvSpec,
    RolloutMode,
    RolloutPolicySpec,
    RolloutRecordConfig,
    RolloutRequest,
    RolloutResponse,
)
from synth_ai.task.validators import validate_rollout_response_for_rl

pytestmark = pytest.mark.e2e  # every test here starts a server or a child process

SAMPLES = Path(__file__).parent / "samples"
TIMING_KEYS = {
    "agent_request_start_s",
    "agent_response_s",
    "inference_ms",
    "env_step_ms",
    "env_step_end_s",
    "decision_ms",
    "overhead_ms",
}
_run_ids = iter(range(1_000_000))


def _request(
    model_url: str, *, mode: RolloutMode = RolloutMode.RL, decisions: int = 3, policy: str = "crafter-react"
) -> RolloutRequest:
    config: dict[str, Any] = {"model": "fake-model", "inference_url": model_url, "max_llm_calls": decisions}
    return RolloutRequest(
        run_id=f"synth-ai-{next(_run_ids)}",
        env=RolloutEnvSpec(env_name="crafter", seed=4),
        policy=RolloutPolicySpec(policy_name=policy, config=config),
        ops=["agent", "env"] * decisions,
        record=RolloutRecordConfig(return_trace=True, trace_format="structured"),
        mode=mode,
    )


async def _rollout(server: AppServer, request: RolloutRequest) -> RolloutResponse:
    """Through synth-ai's own client, which validates the answer with its RolloutResponse."""
    async with TaskAppClient(server.base_url, api_key=TEST_KEY, retries=1) as client:
        return await client.rollout(request)


@pytest.mark.anyio
async def test_rl_rollout_passes_synth_ais_rl_validation(app_server: AppServer, fake_model: FakeModel) -> None:
    fake_model.default = tool_call("move_left", "do")
    called = fake_model.url("/v1/chat/completions?cid=trace_synth_rl")
    response = await _rollout(app_server, _request(fake_model.url("/v1?cid=trace_synth_rl")))
    assert validate_rollout_response_for_rl(response.model_dump()) == []  # raises on any issue
    assert response.pipeline_metadata["inference_url"] == called
    (trajectory,) = response.trajectories
    assert trajectory.inference_url == called
    assert [step.info["meta"]["turn_index"] for step in trajectory.steps if step.info] == [0, 1, 2]
    for step in trajectory.steps:
        assert step.info is not None
        meta = step.info["meta"]
        assert meta["inference_url"] == called
        assert meta["usage"] == DEFAULT_USAGE
        assert meta["inference_ms"] == pytest.approx(meta["timing"]["inference_ms"], abs=0.1)
        timing = meta["timing"]
        assert set(timing) == TIMING_KEYS
        assert timing["agent_request_start_s"] <= timing["agent_response_s"] <= timing["env_step_end_s"]
        parts = timing["inference_ms"] + timing["env_step_ms"] + timing["overhead_ms"]
        assert timing["decision_ms"] == pytest.approx(parts, abs=0.01)
        assert "inference_request" not in meta and "raw_response" not in meta  # those stay in the trace
    assert [record.target for record in fake_model.requests] == [called.removeprefix(fake_model.base_url)] * 3


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["rollout_request_rl.json", "rollout_request_eval.json"])
async def test_sample_requests_through_synth_ais_models(
    app_server: AppServer, fake_model: FakeModel, name: str
) -> None:
    sample: dict[str, Any] = json.loads((SAMPLES / name).read_text())
    sample["ops"] = ["agent", "env"] * 10
    sample["run_id"] = f"{sample['run_id']}-{next(_run_ids)}"
    config = sample["policy"]["config"]
    config["inference_url"] = fake_model.url("/v1/chat/completions?" + config["inference_url"].split("?", 1)[1])
    request = RolloutRequest.model_validate(sample)
    response = await _rollout(app_server, request)
    assert response.metrics.num_steps == 10
    if request.mode is RolloutMode.RL:
        validate_rollout_response_for_rl(response.model_dump())


@pytest.mark.anyio
async def test_scripted_and_provider_rollouts_validate(vendor_app: AppServer, fake_model: FakeModel) -> None:
    """synth-ai's RolloutTrajectory requires a string inference_url, whichever policy ran."""
    server = vendor_app
    scripted = await _rollout(server, _request("", mode=RolloutMode.EVAL, policy="crafter-scripted"))
    assert scripted.trajectories[0].inference_url == ""
    assert all("inference_url" not in (step.info or {})["meta"] for step in scripted.trajectories[0].steps)
    provider = _request("", mode=RolloutMode.EVAL)
    provider.policy.config = {"provider": "openai", "model": "gpt-4o-mini", "max_llm_calls": 3}
    routed = await _rollout(server, provider)
    assert routed.trajectories[0].inference_url == fake_model.url("/v1/chat/completions")
    assert routed.pipeline_metadata["inference_url"] == fake_model.url("/v1/chat/completions")


# --- `synth-ai smoke` ------------------------------------------------------------------------------

CHILD_GUARD = """
import os, socket

_LOOPBACK = {"127.0.0.1", "::1", "localhost"}
_LOG = os.environ["LOOPBACK_GUARD_LOG"]
_connect, _connect_ex, _getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo


def _check(address):
    if isinstance(address, tuple) and str(address[0]) not in _LOOPBACK:
        with open(_LOG, "a") as log:
            log.write(repr(address) + "\\n")
        raise OSError(f"loopback guard: {address!r} is beyond loopback")


def _guarded_connect(self, address):
    _check(address)
    return _connect(self, address)


def _guarded_connect_ex(self, address):
    _check(address)
    return _connect_ex(self, address)


def _guarded_getaddrinfo(host, *args, **kwargs):
    if host is not None and str(host) not in _LOOPBACK:
        _check((str(host), 0))
    return _getaddrinfo(host, *args, **kwargs)


socket.socket.connect, socket.socket.connect_ex = _guarded_connect, _guarded_connect_ex
socket.getaddrinfo = _guarded_getaddrinfo
"""


def _guarded_environment(directory: Path) -> tuple[dict[str, str], Path]:
    """A child environment without the developer's keys or proxies, with the loopback guard loaded."""
    guard_dir, log = directory / "guard", directory / "non-loopback.log"
    guard_dir.mkdir()
    (guard_dir / "sitecustomize.py").write_text(CHILD_GUARD)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(directory), "PYTHONPATH": str(guard_dir)}
    env["LOOPBACK_GUARD_LOG"] = str(log)
    return env, log


def test_child_guard_refuses_the_outside_world(tmp_path: Path) -> None:
    env, log = _guarded_environment(tmp_path)
    probe = "import socket\ntry:\n    socket.create_connection(('192.0.2.1', 80), timeout=1)\nexcept OSError as exc:\n"
    probe += "    print(exc)"
    result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert "beyond loopback" in result.stdout
    assert "192.0.2.1" in log.read_text()


def test_synth_ai_smoke_passes(app_server: AppServer, fake_model: FakeModel, tmp_path: Path) -> None:
    fake_model.default = tool_call("move_right", "do")
    env, log = _guarded_environment(tmp_path)
    command = [
        str(Path(sys.executable).with_name("synth-ai")),
        "smoke",
        "--url",
        app_server.base_url,
        "--api-key",
        TEST_KEY,
        "--policy-name",
        "crafter-react",
        "--model",
        "fake-model",
        "--no-mock",
        "--inference-url",
        fake_model.url("/v1/chat/completions"),
        "--max-steps",
        "3",
        "--return-trace",
    ]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "successes=1/1 total_steps=3 v3_traces=1/1" in result.stdout, output
    assert "validation warning" not in output, output
    assert "✓ 3 tool calls executed" in result.stdout, output
    assert len(fake_model.requests) == 3
    assert all("cid=smoke-" in record.query for record in fake_model.requests)
    assert not log.exists(), log.read_text()
