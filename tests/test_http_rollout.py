"""End to end over real HTTP: `/rollout` (scripted and `crafter-react` against the loopback fake model),
the error model, idempotency, the concurrency cap, run status / abort, deadlines, client disconnects and
the math alias.

Slow rollouts are held by the fake model (`gated`, `hang`), never by sleeping; tests wait by polling.
"""

from __future__ import annotations

import gzip
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from support.errors import error_body
from support.fake_model import FakeModel, gated, hang, tool_call
from support.keys import SECRETS, assert_no_key_material
from support.polling import wait_until
from support.rollouts import SAMPLES, new_run_id, request_body
from support.servers import AppServer, open_rollout
from synth_ai.task.contracts import RolloutResponse as SynthAIRolloutResponse

from task_app.core.contracts import RolloutResponse

pytestmark = [pytest.mark.usefixtures("no_key_in_logs"), pytest.mark.e2e]

WAIT_S = 10.0  # upper bound for polling loops; they normally finish in milliseconds
PROMPT_S = 2.5  # "promptly": an aborted rollout answers within this (its hung model call would take 10 s)
POLICY_KEY = "pk-ZwQxRtYuVmNbKjHg"  # a caller's own model key (policy.config.api_key)
STEP_COUNT = re.compile(r"Step (\d+)/")


# --- helpers --------------------------------------------------------------------------------------


def sample_request(name: str, model: FakeModel, ops: list[Any]) -> dict[str, Any]:
    """A trainer's request from the samples, its ops expanded and its inference_url moved to the fake model."""
    body: dict[str, Any] = json.loads((SAMPLES / name).read_text())
    assert "more items, 20 total" in body["ops"][-1]  # the sample elides the 20 alternating ops
    body["ops"] = ops
    original = urlsplit(body["policy"]["config"]["inference_url"])
    body["policy"]["config"]["inference_url"] = f"{model.base_url}{original.path}?{original.query}"
    body["run_id"] = new_run_id(body["run_id"])
    return body


def rollout_ok(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    RolloutResponse.model_validate(body)
    SynthAIRolloutResponse.model_validate(body)  # as synth-ai 0.2.x trainers read it
    return body


def check_keys(value: Any, shape: Any, where: str = "$") -> None:
    """`value` has at least the keys of the shape file (recursively), with containers where it has them."""
    if isinstance(shape, dict):
        assert isinstance(value, dict), where
        missing = set(shape) - set(value)
        assert not missing, f"{where}: missing {sorted(missing)}"
        for key, sub in shape.items():
            check_keys(value[key], sub, f"{where}.{key}")
    elif isinstance(shape, list) and shape and str(shape[0]).startswith("list["):
        assert isinstance(value, list), where
        if len(shape) > 1 and value:
            check_keys(value[0], shape[1], f"{where}[0]")
    elif isinstance(shape, str) and shape.startswith("dict["):
        assert isinstance(value, dict), where


def model_saw_no_app_key(model: FakeModel, *, authorization: str | None = None) -> None:
    for record in model.requests:
        assert "x-api-key" not in record.headers and "x-api-keys" not in record.headers
        assert record.headers.get("authorization") == authorization
        assert_no_key_material(json.dumps(record.headers) + record.raw.decode("utf-8", "replace"), SECRETS)


def status_of(client: httpx.Client, run_id: str) -> dict[str, Any]:
    response = client.get(f"/run/status/{run_id}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


@pytest.fixture(scope="module")
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="http-test") as executor:
        yield executor


def post_in_background(pool: ThreadPoolExecutor, client: httpx.Client, body: dict[str, Any]) -> Future[httpx.Response]:
    return pool.submit(client.post, "/rollout", json=body)


# --- the scripted policy: response shape ----------------------------------------------------------


def test_scripted_rollout_end_to_end(client: httpx.Client) -> None:
    body = request_body(decisions=4)
    response = client.post("/rollout", json=body)
    result = rollout_ok(response)
    assert result["run_id"] == body["run_id"]
    assert result["aborted"] is False and result["ops_executed"] == 8
    assert result["trace"] is None  # return_trace defaults to false
    assert result["trace_correlation_id"] == f"trace_{body['run_id']}"  # eval default
    assert result["pipeline_metadata"]["trace_correlation_id"] == result["trace_correlation_id"]
    (trajectory,) = result["trajectories"]
    steps = trajectory["steps"]
    assert len(steps) == trajectory["length"] == result["metrics"]["num_steps"] == 4
    actions_so_far = 0
    for step in steps:
        assert set(step) == {"obs", "tool_calls", "reward", "done", "truncated", "info"}
        # obs.text is the observation *before* the step's actions: its step counter is what ran until then
        assert int(STEP_COUNT.search(step["obs"]["text"]).group(1)) == actions_so_far  # type: ignore[union-attr]
        (call,) = step["tool_calls"]
        assert call["tool_name"] == "interact_many" and call["arguments"]["actions"]
        added = step["info"]["achievements_added"]
        assert step["reward"] == (float(len(added)) if added else None)
        assert isinstance(step["done"], bool) and step["truncated"] in (True, False, None)
        meta = step["info"]["meta"]
        assert isinstance(meta, dict) and meta["actions"]
        actions_so_far += len(meta["actions"])
    assert int(STEP_COUNT.search(trajectory["final"]["observation"]["text"]).group(1)) == actions_so_far  # type: ignore[union-attr]
    details = result["metrics"]["details"]
    assert details["stop_reason"] == "completed"
    assert details["achievement_count"] == len(details["achievements"])
    unlocked = [name for step in steps for name in step["info"]["achievements_added"]]
    assert sorted(details["achievements"]) == sorted(unlocked)
    assert result["metrics"]["episode_returns"] == [float(len(unlocked))]


def test_op_aliases_and_dict_ops(client: httpx.Client) -> None:
    ops = ["policy", "environment", {"type": "model"}, {"type": "step"}, {"op": "agent"}, "ENV"]
    result = rollout_ok(client.post("/rollout", json=request_body(decisions=3, ops=ops)))
    assert result["ops_executed"] == 6 and result["metrics"]["num_steps"] == 3


def test_gzip_when_accepted_and_identical_when_not(app_server: AppServer, client: httpx.Client) -> None:
    body = request_body(decisions=10)  # above the compression threshold: a 3-decision answer is not
    raw_client = app_server.client(guard=False)
    with raw_client.stream("POST", "/rollout", json=body, headers={"Accept-Encoding": "gzip"}) as response:
        assert response.status_code == 200
        assert response.headers["content-encoding"] == "gzip"
        compressed = b"".join(response.iter_raw())
    plain = client.post("/rollout", json=body, headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers
    assert gzip.decompress(compressed) == plain.content
    assert_no_key_material(plain.text)
    rollout_ok(plain)
    assert len(plain.content) >= app_server.settings.gzip_min_bytes


def test_env_answers_go_uncompressed_below_the_threshold(make_app_server: Callable[..., AppServer]) -> None:
    """An env answer (a few KB) goes as it is to a client that accepts gzip; lowering the threshold compresses it."""
    accepts = {"Accept-Encoding": "gzip, deflate"}
    for threshold in (None, 1024):
        server = make_app_server(**({} if threshold is None else {"gzip_min_bytes": threshold}))
        http = server.client()
        created = http.post("/create", json={"env_name": "crafter", "seed": 3}, headers=accepts)
        step = {"env_id": created.json()["env_id"], "tool_calls": [{"tool": "interact", "args": {"action": "noop"}}]}
        stepped = http.post("/step", json=step, headers=accepts)
        for response in (created, stepped):
            assert response.status_code == 200
            if threshold is None:
                assert response.headers.get("content-encoding") is None
                assert 1024 < int(response.headers["content-length"]) < server.settings.gzip_min_bytes
            else:
                assert response.headers["content-encoding"] == "gzip"


# --- crafter-react against the fake model: the trainer's samples --------------------------------


@pytest.mark.parametrize(
    ("sample", "ops"),
    [
        ("rl", ["agent", "env"] * 10),
        ("eval", [{"type": "agent"}, {"type": "env"}] * 10),
    ],
    ids=["rl-string-ops", "eval-dict-ops"],
)
def test_trainer_samples_against_the_fake_model(
    client: httpx.Client, fake_model: FakeModel, sample: str, ops: list[Any]
) -> None:
    body = sample_request(f"rollout_request_{sample}.json", fake_model, ops)
    fake_model.default = tool_call("move_right", "do")
    result = rollout_ok(client.post("/rollout", json=body))
    shape = json.loads((SAMPLES / f"rollout_response_{sample}_10steps.shape.json").read_text())
    assert set(result) == set(shape)
    assert set(result["trajectories"][0]) == set(shape["trajectories"][1])
    assert set(result["trace"]) == set(shape["trace"])  # return_trace true, trace_format "structured"
    check_keys(result, shape)
    assert len(result["trajectories"][0]["steps"]) == 10
    assert result["aborted"] is False and result["ops_executed"] == 20
    cid = urlsplit(body["policy"]["config"]["inference_url"]).query.removeprefix("cid=")
    assert result["trace_correlation_id"] == result["pipeline_metadata"]["trace_correlation_id"] == cid
    assert len(result["trace"]["session_time_steps"]) == 10
    assert result["metrics"]["details"]["stop_reason"] == "completed"

    requests = fake_model.requests
    assert len(requests) == 10
    for record in requests:
        assert record.path == "/v1/chat/completions" and record.query == f"cid={cid}"
        sent = record.body
        assert sent["model"] == "mock-model"
        assert sent["tool_choice"] == {"type": "function", "function": {"name": "interact_many"}}
        assert sent["parallel_tool_calls"] is False
        assert [tool["function"]["name"] for tool in sent["tools"]] == ["interact_many"]
    model_saw_no_app_key(fake_model)


def test_compact_trace_format_is_honoured(client: httpx.Client, fake_model: FakeModel) -> None:
    body = request_body(inference_url=fake_model.url(), decisions=2)
    body["record"] = {"return_trace": True, "trace_format": "compact"}
    trace = rollout_ok(client.post("/rollout", json=body))["trace"]
    assert {"session_id", "created_at", "metadata", "events_count", "messages_count", "lm_calls"} <= set(trace)
    assert "session_time_steps" not in trace
    assert len(trace["lm_calls"]) == 2


@pytest.mark.parametrize("path", ["/v1", "/v1/", "", "/v1/chat/completions"])
def test_inference_url_forms_reach_chat_completions(client: httpx.Client, fake_model: FakeModel, path: str) -> None:
    body = request_body(inference_url=f"{fake_model.base_url}{path}?cid=trace_forms", decisions=1)
    result = rollout_ok(client.post("/rollout", json=body))
    assert result["trace_correlation_id"] == "trace_forms"
    (record,) = fake_model.requests
    assert record.path == "/v1/chat/completions"  # never /v1/v1
    assert record.query == "cid=trace_forms"
    model_saw_no_app_key(fake_model)


def test_the_callers_model_key_goes_to_the_model_and_nowhere_else(client: httpx.Client, fake_model: FakeModel) -> None:
    body = request_body(inference_url=fake_model.url(), decisions=1, policy={"config": {"api_key": POLICY_KEY}})
    response = client.post("/rollout", json=body)
    rollout_ok(response)
    assert_no_key_material(response.text, (POLICY_KEY,))
    model_saw_no_app_key(fake_model, authorization=f"Bearer {POLICY_KEY}")


def test_trace_correlation_id_rules(client: httpx.Client, fake_model: FakeModel) -> None:
    error_body(
        client.post("/rollout", json=request_body(inference_url=fake_model.url(), decisions=2, mode="rl")),
        422,
        "missing_trace_correlation_id",
    )
    assert fake_model.requests == []  # refused before any model call
    explicit = request_body(
        inference_url=fake_model.url(),
        decisions=1,
        mode="rl",
        policy={"config": {"trace_correlation_id": "trace_explicit"}},
    )
    assert rollout_ok(client.post("/rollout", json=explicit))["trace_correlation_id"] == "trace_explicit"
    queried = request_body(inference_url=fake_model.url() + "?trace=trace_from_query", decisions=1, mode="rl")
    assert rollout_ok(client.post("/rollout", json=queried))["trace_correlation_id"] == "trace_from_query"
    evaluated = request_body(inference_url=fake_model.url(), decisions=1, mode="eval")
    result = rollout_ok(client.post("/rollout", json=evaluated))
    assert result["trace_correlation_id"] == f"trace_{evaluated['run_id']}"


# --- the error model ------------------------------------------------------------------------------


def _without(key: str) -> dict[str, Any]:
    body = request_body(decisions=3)
    del body[key]
    return body


def _policy(**config: Any) -> dict[str, Any]:
    return request_body(decisions=3, policy={"policy_name": "crafter-react", "config": config})


INVALID_BODIES: list[tuple[str, Any, str]] = [
    ("no-mode", _without("mode"), "invalid_request"),
    ("no-run-id", _without("run_id"), "invalid_request"),
    ("bad-run-id", request_body(decisions=3, run_id="has spaces/and slashes"), "invalid_request"),
    ("bad-mode", request_body(decisions=3, mode="train"), "invalid_request"),
    ("not-an-object", [1, 2, 3], "invalid_request"),
    ("unknown-env", request_body(decisions=3, env={"env_name": "minecraft"}), "unknown_env"),
    ("unknown-policy", request_body(decisions=3, policy={"policy_name": "gpt-director"}), "unknown_policy"),
    ("unknown-op", request_body(decisions=3, ops=["agent", "jump"]), "invalid_op"),
    ("empty-ops", request_body(decisions=3, ops=[]), "empty_ops"),
    ("ftp-url", _policy(model="m", inference_url="ftp://127.0.0.1/v1"), "invalid_inference_url"),
    ("no-scheme-url", _policy(model="m", inference_url="127.0.0.1/v1"), "invalid_inference_url"),
    ("no-model", _policy(inference_url="http://127.0.0.1/v1"), "missing_model"),
    ("no-url", _policy(model="m"), "missing_inference_url"),
    ("zero-cap", request_body(decisions=3, policy={"config": {"max_llm_calls": 0}}), "invalid_policy_config"),
    ("text-cap", request_body(decisions=3, policy={"config": {"max_llm_calls": "ten"}}), "invalid_policy_config"),
    ("negative-seed", request_body(decisions=3, env={"seed": -1}), "seed_out_of_range"),
]


@pytest.mark.parametrize(("body", "code"), [case[1:] for case in INVALID_BODIES], ids=[c[0] for c in INVALID_BODIES])
def test_client_mistakes_are_4xx_with_the_error_body(client: httpx.Client, body: Any, code: str) -> None:
    error_body(client.post("/rollout", json=body), 422, code)
    assert client.get("/health").status_code == 200  # and the server answers the next request


@pytest.mark.parametrize(
    "config",
    [
        {"temperature": "hot"},
        {"max_tokens": -5},
        {"provider": "azure"},
        {"inference_url": "ftp://127.0.0.1/v1"},
    ],
    ids=["bad-temperature", "bad-max-tokens", "bad-provider", "bad-url"],
)
def test_a_rejected_policy_config_never_echoes_its_api_key(client: httpx.Client, config: dict[str, Any]) -> None:
    valid = {"model": "m", "inference_url": "http://127.0.0.1/v1"}
    body = _policy(**{**valid, "api_key": POLICY_KEY, **config})
    response = client.post("/rollout", json=body)
    error_body(response, 422)
    assert_no_key_material(response.text + json.dumps(dict(response.headers)), (POLICY_KEY,))
    wrong_type = _policy(**{**valid, "api_key": [POLICY_KEY], **config})
    response = client.post("/rollout", json=wrong_type)
    error_body(response, 422)
    assert_no_key_material(response.text, (POLICY_KEY,))


def test_body_that_is_not_json_is_400(client: httpx.Client) -> None:
    for content in (b"{not json", b'{"run_id": "x",', b"\xff\xfe"):
        response = client.post("/rollout", content=content, headers={"Content-Type": "application/json"})
        error_body(response, 400, "invalid_json")
    assert client.get("/health").status_code == 200


def test_a_two_megabyte_body_is_413(client: httpx.Client) -> None:
    big = json.dumps(request_body(decisions=3, padding="x" * 2_000_000)).encode()
    error_body(client.post("/rollout", content=big, headers={"Content-Type": "application/json"}), 413)

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit counts the streamed body
        for start in range(0, len(big), 64 * 1024):
            yield big[start : start + 64 * 1024]

    response = client.post("/rollout", content=chunks(), headers={"Content-Type": "application/json"})
    error_body(response, 413)
    assert client.get("/health").status_code == 200
    rollout_ok(client.post("/rollout", json=request_body(decisions=1)))


def test_the_seeds_longest_ops_list_fits_the_default_body_limit(client: httpx.Client) -> None:
    """`["agent", "env"] * 50000` (the seed's safety.max_ops) as requests and aiohttp write it: accepted and
    truncated to 2 x max_llm_calls. Pretty-printed it exceeds 1 MiB: a 413 naming the limit and setting."""
    request = request_body(decisions=1, ops=["agent", "env"] * 50_000, policy={"config": {"max_llm_calls": 4}})
    content = json.dumps(request).encode()
    assert 700_000 < len(content) < 1_048_576
    body = rollout_ok(client.post("/rollout", content=content, headers={"Content-Type": "application/json"}))
    assert (body["ops_executed"], body["metrics"]["details"]["ops_dropped"]) == (8, 99_992)
    pretty = json.dumps({**request, "run_id": new_run_id("pretty")}, indent=2).encode()
    error = error_body(client.post("/rollout", content=pretty, headers={"Content-Type": "application/json"}), 413)
    assert "1048576 bytes" in error["error"]["message"] and "TASKAPP_MAX_BODY_BYTES" in error["error"]["message"]


# --- idempotency, the cap, status and abort -------------------------------------------------------


def test_a_completed_run_id_replays_the_same_bytes_without_a_second_rollout(
    app_server: AppServer, client: httpx.Client, fake_model: FakeModel
) -> None:
    body = request_body(inference_url=fake_model.url(), decisions=2)
    first = client.post("/rollout", json=body)
    rollout_ok(first)
    written = app_server.health()["storage"]["written"]
    status = status_of(client, body["run_id"])
    assert status["status"] == "completed" and status["finished_at"]
    second = client.post("/rollout", json=body)
    assert second.status_code == 200
    assert second.content == first.content
    assert len(fake_model.requests) == 2  # no second rollout
    assert app_server.health()["storage"]["written"] == written  # and no second trace
    assert status_of(client, body["run_id"]) == status


def test_a_running_run_id_is_409_and_status_shows_progress(
    app_server: AppServer, client: httpx.Client, fake_model: FakeModel, pool: ThreadPoolExecutor
) -> None:
    gate = threading.Event()
    fake_model.script(tool_call("noop"))
    fake_model.default = gated(gate)
    body = request_body(inference_url=fake_model.url(), decisions=3)
    background = app_server.client()
    try:
        running = post_in_background(pool, background, body)
        wait_until(lambda: len(fake_model.requests) >= 2)  # the first decision ran, the second is held
        error_body(client.post("/rollout", json=body), 409, "run_in_progress")
        status = status_of(client, body["run_id"])
        assert status["status"] == "running" and status["started_at"] and status["finished_at"] is None
        assert status["progress"]["ops_executed"] >= 2 and status["progress"]["decisions"] >= 1
        assert app_server.health()["rollouts"]["active"] == 1
    finally:
        gate.set()
    result = rollout_ok(running.result(timeout=WAIT_S))
    assert result["aborted"] is False and result["metrics"]["num_steps"] == 3
    finished = status_of(client, body["run_id"])
    assert finished["status"] == "completed" and finished["finished_at"]
    assert finished["progress"]["decisions"] == 3


def test_the_concurrency_cap_answers_429_without_waiting_for_a_slot(
    make_app_server: Callable[..., AppServer], fake_model: FakeModel, pool: ThreadPoolExecutor
) -> None:
    """The refusals come back while both admitted rollouts are held by the model (no clock needed)."""
    server = make_app_server(max_concurrent_rollouts=2)
    gate = threading.Event()
    fake_model.default = gated(gate)
    bodies = [request_body(inference_url=fake_model.url(), decisions=1) for _ in range(4)]
    clients = [server.client() for _ in bodies]
    try:
        futures = [post_in_background(pool, c, body) for c, body in zip(clients, bodies, strict=True)]
        wait_until(lambda: sum(future.done() for future in futures) >= 2)
        refused = [future.result() for future in futures if future.done()]
        assert [response.status_code for response in refused] == [429, 429]
        for response in refused:
            error_body(response, 429, "capacity_exceeded")
            assert int(response.headers["Retry-After"]) >= 1
        assert server.health()["rollouts"] == {"active": 2, "limit": 2, "queued": 0, "paced": 0}
    finally:
        gate.set()
    responses = [future.result(timeout=WAIT_S) for future in futures]
    completed = [response for response in responses if response.status_code == 200]
    assert len(completed) == 2
    for response in completed:
        assert rollout_ok(response)["aborted"] is False
    assert server.health()["rollouts"]["active"] == 0
    rollout_ok(server.client().post("/rollout", json=request_body(decisions=1)))  # the slots were released


def test_unknown_runs_are_404(client: httpx.Client) -> None:
    error_body(client.get("/run/status/never-started"), 404, "run_not_found")
    error_body(client.post("/run/abort", json={"run_id": "never-started"}), 404, "run_not_found")
    error_body(client.post("/run/abort", json={}), 422, "invalid_request")


def test_abort_stops_a_running_rollout_promptly(
    app_server: AppServer, client: httpx.Client, fake_model: FakeModel, pool: ThreadPoolExecutor
) -> None:
    fake_model.script(tool_call("noop"))
    fake_model.default = hang()
    body = request_body(inference_url=fake_model.url(), decisions=5)
    running = post_in_background(pool, app_server.client(), body)
    wait_until(lambda: len(fake_model.requests) >= 2)
    aborted_at = time.monotonic()
    response = client.post("/run/abort", json={"run_id": body["run_id"]})
    assert response.status_code == 200
    assert response.json()["ok"] is True and response.json()["run_id"] == body["run_id"]
    result = rollout_ok(running.result(timeout=WAIT_S))
    assert time.monotonic() - aborted_at < PROMPT_S
    assert result["aborted"] is True
    assert result["metrics"]["details"]["stop_reason"] == "aborted"
    assert result["metrics"]["num_steps"] == 1  # what ran before the abort is returned
    assert status_of(client, body["run_id"])["status"] == "aborted"
    again = client.post("/run/abort", json={"run_id": body["run_id"]})  # idempotent
    assert again.status_code == 200 and again.json()["ok"] is True
    assert app_server.health()["rollouts"]["active"] == 0


def test_the_deadline_returns_what_ran(client: httpx.Client, fake_model: FakeModel) -> None:
    fake_model.script(tool_call("noop"))
    fake_model.default = hang()
    body = request_body(inference_url=fake_model.url(), decisions=5)
    body["safety"] = {"max_time_s": 1}
    result = rollout_ok(client.post("/rollout", json=body))
    # the server's own clock (no HTTP, no test threads): the 1 s deadline, not the 10 s read timeout
    assert 0.9 <= result["metrics"]["details"]["duration_s"] < 2.0
    assert result["aborted"] is True
    assert result["metrics"]["details"]["stop_reason"] == "deadline"
    assert result["metrics"]["num_steps"] == 1
    assert status_of(client, body["run_id"])["status"] == "aborted"


@pytest.mark.parametrize("how", ["closed-socket", "client-read-timeout"])
def test_a_client_that_goes_away_aborts_its_rollout(
    app_server: AppServer, client: httpx.Client, fake_model: FakeModel, how: str
) -> None:
    fake_model.default = hang()
    body = request_body(inference_url=fake_model.url(), decisions=3)
    if how == "closed-socket":
        sock = open_rollout(app_server.base_url, body, timeout=WAIT_S)
        wait_until(lambda: len(fake_model.requests) >= 1)
        sock.close()
    else:
        impatient = app_server.client(timeout=WAIT_S)
        with pytest.raises(httpx.ReadTimeout):
            impatient.post("/rollout", json=body, timeout=httpx.Timeout(WAIT_S, read=0.5))
        assert len(fake_model.requests) >= 1
    wait_until(lambda: status_of(client, body["run_id"])["status"] != "running")
    assert status_of(client, body["run_id"])["status"] == "aborted"
    wait_until(lambda: app_server.health()["rollouts"]["active"] == 0)


# --- the math alias -------------------------------------------------------------------------------


def _math(model: FakeModel) -> dict[str, Any]:
    body = request_body(inference_url=model.url(), decisions=2)
    body["env"]["env_name"] = "math_single_step"
    body["policy"]["policy_name"] = "math-react"
    return body


def test_math_requests_are_remapped_to_crafter(client: httpx.Client, fake_model: FakeModel) -> None:
    result = rollout_ok(client.post("/rollout", json=_math(fake_model)))
    assert result["pipeline_metadata"]["alias_applied"] is True
    assert result["pipeline_metadata"]["policy_name"] == "crafter-react"
    assert result["metrics"]["num_steps"] == 2
    assert "stepwise" in result["metrics"]["details"]  # the remap turns on the seed's step rewards


def test_the_math_alias_can_be_switched_off(make_app_server: Callable[..., AppServer], fake_model: FakeModel) -> None:
    server = make_app_server(math_alias_enabled=False)
    error_body(server.client().post("/rollout", json=_math(fake_model)), 422, "unknown_env")
    assert fake_model.requests == []


def test_crafter_requests_are_not_remapped(client: httpx.Client) -> None:
    result = rollout_ok(client.post("/rollout", json=request_body(decisions=1)))
    assert result["pipeline_metadata"]["alias_applied"] is False
