"""The adapters wait out the app's 429s instead of failing a training step: a loopback stub answers
`too_many_live_envs` (every live env of the process busy) with Retry-After before it lets the create
through. TRL's `CrafterEnv.reset()` is the case the issue names; the other adapters share its policy."""

from __future__ import annotations

import asyncio
import time

import pytest
from stub_server import Reply, StubServer, app_error

from task_app_client import RateLimitError, RetryPolicy
from task_app_client.nemo_gym import CrafterGymnasium
from task_app_client.trl import TRAINER_RETRY, CrafterEnv

pytestmark = pytest.mark.e2e

CREATED = {"env_id": "env-1", "observation": {"text": "Step 0/10000, day"}, "info": {"seed": 4}, "step_idx": 0}
BUSY = Reply(429, app_error("too_many_live_envs", retryable=True), {"Retry-After": "0.3"})


def test_reset_waits_out_too_many_live_envs() -> None:
    with StubServer() as stub:
        stub.script(BUSY, BUSY, Reply(200, CREATED))
        environment = CrafterEnv(stub.base_url, "key")
        started = time.monotonic()
        assert environment.reset(seed=4) == "Step 0/10000, day"
        assert time.monotonic() - started >= 0.6  # twice the server's Retry-After
        assert [path for _, _, path in stub.arrivals] == ["/create"] * 3
        stub.default = Reply(200, {"ok": True})
        del environment  # the dropped env's session is terminated by its finalizer
        assert stub.arrivals[-1][2] == "/terminate"


def test_the_trainer_policy_is_patient_and_bounded() -> None:
    assert TRAINER_RETRY.attempts == 12 and TRAINER_RETRY.max_backoff == 30.0
    with StubServer(default=BUSY) as stub:
        impatient = CrafterEnv(stub.base_url, "key", retry=RetryPolicy(attempts=2, backoff=0.01))
        with pytest.raises(RateLimitError) as refused:
            impatient.reset()
        assert (refused.value.code, refused.value.retryable) == ("too_many_live_envs", True)
        assert len(stub.arrivals) == 2


def test_nemo_gym_reset_waits_it_out_too() -> None:
    async def main() -> None:
        with StubServer() as stub:
            stub.script(BUSY, Reply(200, CREATED))
            env = CrafterGymnasium(stub.base_url, "key")
            observation, info = await env.reset({"seed": 4}, "sid")
            assert (observation, info["env_id"]) == ("Step 0/10000, day", "env-1")
            stub.default = Reply(200, {"ok": True})
            await env.aclose()
            assert [path for _, _, path in stub.arrivals] == ["/create", "/create", "/terminate"]

    asyncio.run(main())
