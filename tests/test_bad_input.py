"""Bad input on a real server, one row per mistake: each gets its precise 4xx and error code, never a
500, and the server answers the next request.

Rows already covered elsewhere (not repeated here): missing / wrong / prefix / case-changed keys and
the wrong auth schemes (`test_http_basics.py::test_rejected_keys_get_401`), no key configured
(`test_no_key_configured_means_not_ready_and_503`), non-integer and out-of-range `/task_info` seeds
and more than 256 of them, missing mode / run_id, unknown env / policy / op, empty ops, ftp and
scheme-less inference URLs, a zero or textual `max_llm_calls`, a negative seed, a run_id with spaces
and slashes, a body that is not JSON, and a 2 MB body, chunked or not (`test_http_rollout.py`).
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from support.errors import error_body
from support.keys import ALIAS_KEY, TEST_KEY, assert_no_key_material
from support.rollouts import request_body
from support.servers import AppServer

pytestmark = [pytest.mark.usefixtures("no_key_in_logs"), pytest.mark.e2e]

JSON = {"Content-Type": "application/json"}
MODEL_URL = "http://127.0.0.1:9/v1"  # nobody listens: these requests never get as far as a model call


def without(key: str, within: str | None = None) -> dict[str, Any]:
    request = request_body(decisions=1)
    (request[within] if within else request).pop(key)
    return request


def with_value(path: str, raw: str) -> bytes:
    """A valid request whose field at dotted `path` is the raw JSON text `raw` (NaN, deep nesting, ...)."""
    request = request_body(decisions=1)
    *parents, leaf = path.split(".")
    target = request
    for part in parents:
        target = target.setdefault(part, {})
    target[leaf] = "@@RAW@@"
    return json.dumps(request).replace('"@@RAW@@"', raw).encode()


def nested(depth: int, kind: str = "array") -> bytes:
    if kind == "array":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


@pytest.fixture(autouse=True)
def still_serving(app_server: AppServer) -> Any:
    """After every row the server answers the next request, and nothing is left running."""
    yield
    health = app_server.health()
    assert health["healthy"] is True
    assert health["rollouts"]["active"] == 0


# --- keys -----------------------------------------------------------------------------------------

MALFORMED_KEYS: list[tuple[str, dict[str, Any]]] = [
    ("latin-1-bytes", {"X-API-Key": "tk-\xe9\xe8\xff".encode("latin-1")}),
    ("utf-8-bytes", {"X-API-Key": "tk-ключ".encode()}),
    ("4-kb-key", {"X-API-Key": "k" * 4096}),
    ("key-with-spaces", {"X-API-Key": f"{TEST_KEY[:6]} {TEST_KEY[6:]}"}),
    ("only-commas", {"X-API-Keys": ",,, ,"}),
    ("two-bearer-tokens", {"Authorization": f"Bearer not-a-key {TEST_KEY}"}),
    ("bearer-of-key-list", {"Authorization": f"Bearer {TEST_KEY},{ALIAS_KEY}"}),
    ("quoted-key", {"X-API-Key": f'"{TEST_KEY}"'}),
    ("tab-inside", {"X-API-Key": f"{TEST_KEY[:5]}\t{TEST_KEY[5:]}"}),
]


@pytest.mark.parametrize("headers", [case[1] for case in MALFORMED_KEYS], ids=[case[0] for case in MALFORMED_KEYS])
def test_malformed_keys_are_401(app_server: AppServer, headers: dict[str, Any]) -> None:
    client = app_server.client(key=None, headers=headers)
    error_body(client.get("/info"), 401, "unauthorized")
    error_body(client.post("/rollout", json=request_body(decisions=1)), 401, "unauthorized")
    error_body(client.post("/rollout", content=nested(100_000), headers=JSON), 401, "unauthorized")


@pytest.mark.parametrize(
    "content",
    [b"{not json", nested(100_000), b'{"run_id": "\\ud800"}', b""],
    ids=["broken", "deep", "surrogate", "empty"],
)
def test_no_key_configured_wins_over_a_bad_body(make_app_server: Callable[..., AppServer], content: bytes) -> None:
    server = make_app_server(environment_api_key=None, environment_api_key_aliases=[], warm_up=False)
    for key in (None, TEST_KEY):
        response = server.client(key=key).post("/rollout", content=content, headers=JSON)
        error_body(response, 503, "missing_environment_api_key")


# --- bodies that are not (acceptable) JSON ---------------------------------------------------------

NOT_JSON: list[tuple[str, bytes, dict[str, str], int, str]] = [
    ("nan-literal", with_value("safety.max_time_s", "NaN"), JSON, 400, "invalid_json"),
    ("infinity-literal", with_value("safety.max_time_s", "Infinity"), JSON, 400, "invalid_json"),
    ("number-overflows-double", with_value("env.seed", "1e400"), JSON, 400, "invalid_json"),
    (
        "lone-surrogate-in-config",
        with_value("policy.config.trace_correlation_id", '"\\ud800"'),
        JSON,
        400,
        "invalid_json",
    ),
    ("lone-low-surrogate", with_value("training_session_id", '"\\udc00x"'), JSON, 400, "invalid_json"),
    ("invalid-utf8", with_value("synth_base_url", '"\xff"').replace(b"\xc3\xbf", b"\xff"), JSON, 400, "invalid_json"),
    ("trailing-garbage", json.dumps(request_body(decisions=1)).encode() + b" }", JSON, 400, "invalid_json"),
    ("utf16-body", json.dumps(request_body(decisions=1)).encode("utf-16"), JSON, 400, "invalid_json"),
    ("empty-body", b"", JSON, 422, "invalid_request"),
    ("json-null", b"null", JSON, 422, "invalid_request"),
    ("json-string", b'"rollout"', JSON, 422, "invalid_request"),
    (
        "form-encoded",
        b"run_id=x&mode=eval",
        {"Content-Type": "application/x-www-form-urlencoded"},
        422,
        "invalid_request",
    ),
    ("nested-100k-arrays", nested(100_000), JSON, 400, "invalid_json"),
    ("nested-100k-objects", nested(100_000, "object"), JSON, 400, "invalid_json"),
    ("nested-2000-in-config", with_value("policy.config.extra", nested(2000).decode()), JSON, 400, "invalid_json"),
]


@pytest.mark.parametrize(
    ("content", "headers", "status", "code"), [case[1:] for case in NOT_JSON], ids=[case[0] for case in NOT_JSON]
)
def test_bodies_that_are_not_acceptable_json(
    client: httpx.Client, content: bytes, headers: dict[str, str], status: int, code: str
) -> None:
    assert len(content) < 1_048_576  # within the size limit: the parser, not the limit, refuses it
    error_body(client.post("/rollout", content=content, headers=headers), status, code)


def test_deep_nesting_within_the_parser_limit_is_accepted_and_not_echoed(client: httpx.Client) -> None:
    """900 levels parse (orjson allows 1024); the config's extra key is ignored, the rollout runs."""
    request = with_value("policy.config.extra", nested(900).decode())
    response = client.post("/rollout", content=request, headers=JSON)
    assert response.status_code == 200, response.text
    assert "[[[[" not in response.text
    assert response.json()["metrics"]["details"]["storage"]["trace"] == {"stored": True}


# --- wrong types and out-of-range values in a rollout request --------------------------------------

INVALID: list[tuple[str, dict[str, Any], str]] = [
    # wrong types
    ("run-id-int", request_body(decisions=1, run_id=5), "invalid_request"),
    ("mode-int", request_body(decisions=1, mode=1), "invalid_request"),
    ("mode-null", request_body(decisions=1, mode=None), "invalid_request"),
    ("env-string", request_body(decisions=1, env="crafter"), "invalid_request"),
    ("env-config-list", request_body(decisions=1, env={"config": [1]}), "invalid_request"),
    ("env-params-list", request_body(decisions=1, env={"config": {"env_params": [1]}}), "invalid_env_config"),
    ("policy-list", request_body(decisions=1, policy=["crafter-scripted"]), "invalid_request"),
    ("ops-string", request_body(decisions=1, ops="agent,env"), "invalid_request"),
    ("ops-object", request_body(decisions=1, ops={"0": "agent"}), "invalid_request"),
    ("op-int", request_body(decisions=1, ops=[1, 2]), "invalid_op"),
    ("op-null", request_body(decisions=1, ops=[None]), "invalid_op"),
    ("op-list", request_body(decisions=1, ops=[["agent"]]), "invalid_op"),
    ("record-string", request_body(decisions=1, record="all"), "invalid_request"),
    ("trace-format-unknown", request_body(decisions=1, record={"trace_format": "xml"}), "invalid_request"),
    ("on-done-unknown", request_body(decisions=1, on_done="explode"), "invalid_request"),
    ("safety-max-ops-text", request_body(decisions=1, safety={"max_ops": "many"}), "invalid_request"),
    ("safety-max-ops-zero", request_body(decisions=1, safety={"max_ops": 0}), "invalid_request"),
    ("safety-max-time-negative", request_body(decisions=1, safety={"max_time_s": -1}), "invalid_request"),
    ("training-session-id-int", request_body(decisions=1, training_session_id=7), "invalid_request"),
    (
        "temperature-text",
        request_body(inference_url=MODEL_URL, policy={"config": {"temperature": "hot"}}),
        "invalid_policy_config",
    ),
    (
        "max-tokens-float",
        request_body(inference_url=MODEL_URL, policy={"config": {"max_tokens": 1.5}}),
        "invalid_policy_config",
    ),
    (
        "api-key-object",
        request_body(inference_url=MODEL_URL, policy={"config": {"api_key": {"k": "v"}}}),
        "invalid_policy_config",
    ),
    ("step-rewards-list", request_body(decisions=1, policy={"config": {"step_rewards": [1]}}), "invalid_policy_config"),
    # ops
    ("unknown-op-object", request_body(decisions=1, ops=[{"type": "jump"}]), "invalid_op"),
    ("op-object-without-type", request_body(decisions=1, ops=[{}]), "invalid_op"),
    ("unknown-op-after-valid-ones", request_body(decisions=1, ops=["agent", "env"] * 50 + ["fly"]), "invalid_op"),
    ("op-type-not-a-string", request_body(decisions=1, ops=[{"type": 1}]), "invalid_op"),
    ("op-object-with-null-type", request_body(decisions=1, ops=[{"type": None}]), "invalid_op"),
    ("bad-op-after-50000-good-ones", request_body(decisions=1, ops=["agent", "env"] * 25_000 + [{}]), "invalid_op"),
    # max_steps_per_episode
    (
        "max-steps-zero",
        request_body(decisions=1, env={"config": {"env_params": {"max_steps_per_episode": 0}}}),
        "invalid_env_config",
    ),
    (
        "max-steps-negative",
        request_body(decisions=1, env={"config": {"env_params": {"max_steps_per_episode": -5}}}),
        "invalid_env_config",
    ),
    (
        "max-steps-huge",
        request_body(decisions=1, env={"config": {"env_params": {"max_steps_per_episode": 2**63}}}),
        "invalid_env_config",
    ),
    (
        "max-steps-enormous",
        request_body(decisions=1, env={"config": {"env_params": {"max_steps_per_episode": 10**30}}}),
        "invalid_env_config",
    ),
    (
        "max-steps-string",
        request_body(decisions=1, env={"config": {"env_params": {"max_steps_per_episode": "ten"}}}),
        "invalid_env_config",
    ),
    (
        "max-steps-float",
        request_body(decisions=1, env={"config": {"env_params": {"max_steps_per_episode": 2.5}}}),
        "invalid_env_config",
    ),
    ("episode-length-zero", request_body(decisions=1, env={"config": {"length": 0}}), "invalid_env_config"),
    ("area-too-large", request_body(decisions=1, env={"config": {"area": [10_000, 10_000]}}), "invalid_env_config"),
    ("area-too-small", request_body(decisions=1, env={"config": {"area": [3, 3]}}), "invalid_env_config"),
    (
        "max-llm-calls-over-the-cap",
        request_body(decisions=1, policy={"config": {"max_llm_calls": 10_001}}),
        "invalid_policy_config",
    ),
    (
        "max-llm-calls-negative",
        request_body(decisions=1, policy={"config": {"max_llm_calls": -3}}),
        "invalid_policy_config",
    ),
    # seeds
    ("seed-above-max", request_body(decisions=1, env={"seed": 2**31}), "seed_out_of_range"),
    ("seed-64-bit", request_body(decisions=1, env={"seed": 2**63}), "seed_out_of_range"),
    (
        "seed-beyond-64-bit",
        request_body(decisions=1, env={"seed": 10**30}),
        "invalid_request",
    ),  # parsed as a float: int_parsing_size
    ("seed-fraction", request_body(decisions=1, env={"seed": 1.5}), "invalid_request"),
    ("seed-text", request_body(decisions=1, env={"seed": "abc"}), "invalid_request"),
    ("seed-list", request_body(decisions=1, env={"seed": [1]}), "invalid_request"),
    # names
    ("unknown-env-id", request_body(decisions=1, env={"env_name": None, "env_id": "minecraft"}), "unknown_env"),
    ("no-env-name", request_body(decisions=1, env={"env_name": None}), "unknown_env"),
    ("blank-env-name", request_body(decisions=1, env={"env_name": "   "}), "unknown_env"),
    (
        "unknown-policy-id",
        request_body(decisions=1, policy={"policy_name": None, "policy_id": "gpt-director"}),
        "unknown_policy",
    ),
    ("no-policy-name", request_body(decisions=1, policy={"policy_name": None}), "unknown_policy"),
    ("blank-policy-name", request_body(decisions=1, policy={"policy_name": " "}), "unknown_policy"),
    # inference URLs
    ("javascript-url", request_body(inference_url="javascript:alert(1)"), "invalid_inference_url"),
    ("file-url", request_body(inference_url="file:///etc/passwd"), "invalid_inference_url"),
    ("gopher-url", request_body(inference_url="gopher://127.0.0.1:70/"), "invalid_inference_url"),
    ("no-host-url", request_body(inference_url="http:///v1"), "invalid_inference_url"),
    ("port-out-of-range", request_body(inference_url="http://127.0.0.1:99999/v1"), "invalid_inference_url"),
    ("port-not-a-number", request_body(inference_url="http://127.0.0.1:abc/v1"), "invalid_inference_url"),
    ("broken-ipv6", request_body(inference_url="http://[::1/v1"), "invalid_inference_url"),
    ("space-in-host", request_body(inference_url="http://model server/v1"), "invalid_inference_url"),
    ("header-injection", request_body(inference_url="http://127.0.0.1:9/v1\r\nX-Injected: 1"), "invalid_inference_url"),
    ("nul-in-url", request_body(inference_url="http://127.0.0.1:9/v1\x00"), "invalid_inference_url"),
    ("user-and-password", request_body(inference_url="http://user:secret@127.0.0.1:9/v1"), "invalid_inference_url"),
    ("user-only", request_body(inference_url="https://token@127.0.0.1:9/v1"), "invalid_inference_url"),
    ("url-not-a-string", request_body(inference_url=["http://127.0.0.1:9/v1"]), "invalid_policy_config"),
    (
        "unknown-provider",
        request_body(policy={"policy_name": "crafter-react", "config": {"model": "m", "provider": "azure"}}),
        "invalid_policy_config",
    ),
    # run ids
    ("run-id-slash", request_body(decisions=1, run_id="a/b"), "invalid_request"),
    ("run-id-dot-dot", request_body(decisions=1, run_id=".."), "invalid_request"),
    ("run-id-single-dot", request_body(decisions=1, run_id="."), "invalid_request"),
    ("run-id-parent-path", request_body(decisions=1, run_id="..:..:etc"), "invalid_request"),
    ("run-id-dots-inside", request_body(decisions=1, run_id="a..b"), "invalid_request"),
    ("run-id-nul", request_body(decisions=1, run_id="run\x00id"), "invalid_request"),
    ("run-id-backslash", request_body(decisions=1, run_id="a\\b"), "invalid_request"),
    ("run-id-unicode", request_body(decisions=1, run_id="rün"), "invalid_request"),
    ("run-id-10-kb", request_body(decisions=1, run_id="r" * 10_240), "invalid_request"),
    ("run-id-201-chars", request_body(decisions=1, run_id="r" * 201), "invalid_request"),
    ("run-id-empty", request_body(decisions=1, run_id=""), "invalid_request"),
]


@pytest.mark.parametrize(("request_json", "code"), [case[1:] for case in INVALID], ids=[case[0] for case in INVALID])
def test_rollout_mistakes_are_422_with_a_precise_code(client: httpx.Client, request_json: Any, code: str) -> None:
    response = client.post("/rollout", json=request_json)
    error = error_body(response, 422, code)
    if isinstance(request_json, dict) and isinstance(request_json.get("policy"), dict):
        assert_no_key_material(json.dumps(error), ("secret",))  # a URL's password is never echoed


def test_a_provider_without_a_vendor_key_is_503_not_500(client: httpx.Client) -> None:
    """The policy is built after admission; its NotConfigured used to surface as a 500 (task group wrapping)."""
    request = request_body(policy={"policy_name": "crafter-react", "config": {"model": "m", "provider": "openai"}})
    error_body(client.post("/rollout", json=request), 503, "missing_openai_api_key")
    error_body(
        client.post(
            "/rollout",
            json=request_body(policy={"policy_name": "crafter-react", "config": {"model": "m", "provider": "groq"}}),
        ),
        503,
        "missing_groq_api_key",
    )


# --- run ids in paths and the abort body -----------------------------------------------------------


@pytest.mark.parametrize(
    "run_id_text",
    ["a/b", "..", "a..b", "run\x00id", "r" * 10_240, "rün"],
    ids=["slash", "dotdot", "dots-inside", "nul", "10-kb", "unicode"],
)
def test_abort_with_a_hostile_run_id_is_422(client: httpx.Client, run_id_text: str) -> None:
    error_body(client.post("/run/abort", json={"run_id": run_id_text}), 422, "invalid_request")


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/run/status/a%2Fb", 404, "not_found"),  # decoded to a/b: no such route
        ("/run/status/a..b", 422, "invalid_request"),
        ("/run/status/run%00id", 422, "invalid_request"),
        ("/run/status/" + "r" * 10_240, 422, "invalid_request"),
        ("/run/status/r%C3%BCn", 422, "invalid_request"),
        ("/run/status/..%2F..%2Fetc", 404, "not_found"),
        ("/run/status/never-ran", 404, "run_not_found"),
    ],
    ids=["slash", "dots-inside", "nul", "10-kb", "unicode", "traversal", "well-formed-but-unknown"],
)
def test_run_status_with_a_hostile_run_id(client: httpx.Client, path: str, status: int, code: str) -> None:
    error_body(client.get(path), status, code)


# --- /task_info ------------------------------------------------------------------------------------


def _raw_get(base_url: str, target: str) -> tuple[int, bytes]:
    """GET with a request target longer than httpx allows (64 KB URL components)."""
    parts = urlsplit(base_url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    try:
        connection.request("GET", target, headers={"X-API-Key": TEST_KEY})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_ten_thousand_seeds_are_refused_cheaply(app_server: AppServer) -> None:
    misses = app_server.health()["world_cache"]["misses"]
    query = "&".join(f"seed={value}" for value in range(5_000))  # 48 KB: the app reads it and counts
    status, content = _raw_get(app_server.base_url, f"/task_info?{query}")
    assert status == 422, content[:300]
    error = json.loads(content)
    assert error["error"]["code"] == "too_many_seeds" and "5000" in error["error"]["message"]
    query = "&".join(f"seed={value}" for value in range(10_000))
    assert len(query) > 65_536  # httpx would refuse to send it; a trainer's own client may not
    status, content = _raw_get(app_server.base_url, f"/task_info?{query}")
    assert status == 400, content[:300]  # the HTTP parser's refusal, in the app's error shape
    error = json.loads(content)
    assert error["error"]["code"] == "invalid_http_request" and "64 KB" in error["error"]["message"]
    assert_no_key_material(content.decode())
    assert app_server.health()["world_cache"]["misses"] == misses  # refused before any world was built


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"seed": "1e3"}, "invalid_request"),
        ({"seed": "0x10"}, "invalid_request"),
        ({"seeds": ["1", "two"]}, "invalid_request"),
        ({"seed": str(2**64)}, "seed_out_of_range"),
        ({"seed": "-0"}, None),  # -0 is 0: a valid seed
    ],
    ids=["exponent", "hex", "second-bad", "beyond-64-bit", "minus-zero"],
)
def test_task_info_seed_forms(client: httpx.Client, params: dict[str, Any], code: str | None) -> None:
    response = client.get("/task_info", params=params)
    if code is None:
        assert response.status_code == 200
        assert response.json()["dataset"]["seed"] == 0
    else:
        error_body(response, 422, code)


# --- the size limit -------------------------------------------------------------------------------


def test_one_byte_over_the_body_limit_is_413(make_app_server: Callable[..., AppServer]) -> None:
    server = make_app_server(max_body_bytes=4096, warm_up=False)
    client = server.client()
    request = json.dumps(request_body(decisions=1, padding="")).encode()
    at_limit = request[:-1] + b" " * (4096 - len(request)) + b"}"
    assert len(at_limit) == 4096
    assert client.post("/rollout", content=at_limit, headers=JSON).status_code == 200
    over = at_limit[:-1] + b" }"
    error_body(client.post("/rollout", content=over, headers=JSON), 413, "payload_too_large")
    error_body(client.post("/run/abort", content=b" " * 5000 + b"{}", headers=JSON), 413, "payload_too_large")
    error_body(client.post("/proxy/v1/chat/completions", content=b" " * 5000, headers=JSON), 413, "payload_too_large")
    assert client.get("/health").status_code == 200
