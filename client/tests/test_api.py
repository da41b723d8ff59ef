"""The public surface, the configuration, the retry rule and the error mapping: no server needed."""

from __future__ import annotations

import inspect
import json
import re
from typing import Any

import httpx
import pytest

import task_app_client
from task_app_client import (
    APIConnectionError,
    APIStatusError,
    AsyncClient,
    AsyncEnv,
    AuthenticationError,
    BadRequestError,
    Client,
    ConflictError,
    Env,
    GoneError,
    InternalServerError,
    NotFoundError,
    RateLimitError,
    RetryPolicy,
    RolloutRequest,
    ServiceUnavailableError,
    Timeout,
    rollout_request,
)
from task_app_client._config import Config
from task_app_client._errors import error_from_response, retry_after_s
from task_app_client._flow import attempt_timeout, should_retry
from task_app_client._requests import rollout_body, tool_calls_of

# --- the public API ---------------------------------------------------------------------------------


def test_all_is_the_sorted_set_of_public_names() -> None:
    public = sorted(name for name in vars(task_app_client) if not name.startswith("_"))
    public = [name for name in public if not inspect.ismodule(getattr(task_app_client, name))]
    assert task_app_client.__all__ == sorted(task_app_client.__all__)
    assert task_app_client.__all__ == public


def _public_methods(cls: type) -> dict[str, Any]:
    return {name: member for name, member in inspect.getmembers(cls) if not name.startswith("_") and callable(member)}


@pytest.mark.parametrize(("sync", "mirror"), [(Client, AsyncClient), (Env, AsyncEnv)])
def test_the_async_api_mirrors_the_sync_one(sync: type, mirror: type) -> None:
    """Same methods, same parameters, every async one a coroutine (closing is `aclose`, as in httpx)."""
    ours, theirs = _public_methods(sync), _public_methods(mirror)
    assert set(ours) - {"close"} == set(theirs) - {"aclose"}
    for name, method in ours.items():
        if name == "close":
            continue
        twin = theirs[name]
        assert inspect.iscoroutinefunction(twin) or name in ("env", "restore"), name
        assert list(inspect.signature(method).parameters) == list(inspect.signature(twin).parameters), name
        assert twin.__doc__ and method.__doc__, name
        assert twin.__doc__ == method.__doc__ or name in ("env", "restore"), name  # these say how to enter
    assert list(inspect.signature(sync).parameters) == list(inspect.signature(mirror).parameters)


def test_url_and_key_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASK_APP_URL", "http://127.0.0.1:9/")
    monkeypatch.setenv("ENVIRONMENT_API_KEY", "from-env-secret")
    with Client() as client:
        assert client.base_url == "http://127.0.0.1:9"
        assert client._http.headers["X-API-Key"] == "from-env-secret"
        assert "from-env-secret" not in repr(client)
    with Client("http://127.0.0.1:8", "given") as client:
        assert (client.base_url, client._http.headers["X-API-Key"]) == ("http://127.0.0.1:8", "given")


def test_a_missing_url_or_key_is_refused() -> None:
    with pytest.raises(ValueError, match="TASK_APP_URL"):
        Client(api_key="k")
    with pytest.raises(ValueError, match="ENVIRONMENT_API_KEY"):
        AsyncClient("http://127.0.0.1:9")


def test_config_values_are_checked() -> None:
    assert Config.resolve("http://h", "k", 7, None).timeout == Timeout(total=7.0)
    with pytest.raises(ValueError, match="total"):
        Timeout(total=0)
    with pytest.raises(ValueError, match="attempts"):
        RetryPolicy(attempts=0)
    assert RetryPolicy.never().attempts == 1
    assert "secret" not in repr(Config.resolve("http://h", "secret", None, None))


def test_an_attempt_never_outlasts_the_deadline() -> None:
    assert attempt_timeout(Timeout(connect=5, total=60), 2.5) == httpx.Timeout(2.5, connect=2.5)
    assert attempt_timeout(Timeout(connect=5, total=60), 40.0) == httpx.Timeout(40.0, connect=5.0)


# --- backoff, jitter and the retry rule -------------------------------------------------------------


def test_backoff_doubles_up_to_its_cap_and_jitter_stays_in_bounds() -> None:
    policy = RetryPolicy(backoff=0.5, max_backoff=3.0, jitter=0.25)
    for retry, base in enumerate([0.5, 1.0, 2.0, 3.0, 3.0]):
        assert policy.delay(retry, None, 0.0) == base
        assert policy.delay(retry, None, 0.999999) == pytest.approx(base * 1.25, rel=1e-5)
        assert base <= policy.delay(retry, None, 0.5) < base * 1.25


def test_retry_after_is_a_floor_that_jitter_only_lengthens() -> None:
    policy = RetryPolicy(backoff=0.5, max_backoff=8.0, jitter=0.25)
    assert policy.delay(0, 5.0, 0.0) == 5.0
    assert 5.0 <= policy.delay(0, 5.0, 0.99) < 6.25
    assert policy.delay(4, 1.0, 0.0) == 8.0  # the backoff is longer than the server asked


def test_retry_after_in_seconds_or_as_a_date() -> None:
    assert retry_after_s("3") == 3.0
    assert retry_after_s(None) is None
    assert retry_after_s("soon") is None
    assert retry_after_s("Thu, 01 Jan 1970 00:00:10 GMT", now=4.0) == pytest.approx(6.0)


def _error(status: int, retryable: bool | None) -> APIStatusError:
    body: dict[str, Any] = {"error": {"code": "x", "message": "m"}}
    if retryable is not None:
        body["error"]["retryable"] = retryable
    return error_from_response(httpx.Response(status, json=body))


@pytest.mark.parametrize(
    ("status", "verdict", "idempotent", "retried"),
    [
        (429, True, False, True),  # the server says the same request can succeed: any call
        (429, None, True, True),  # no verdict (a proxy's answer): only an idempotent call
        (429, None, False, False),
        (503, True, False, True),
        (503, False, True, False),  # not_configured: waiting does not help
        (503, None, True, True),
        (503, None, False, False),
        (502, True, True, False),  # only 429 and 503
        (409, True, True, False),
        (500, True, True, False),
    ],
)
def test_which_answers_are_retried(status: int, verdict: bool | None, idempotent: bool, retried: bool) -> None:
    assert should_retry(_error(status, verdict), None, idempotent) is retried


def test_which_connection_failures_are_retried() -> None:
    failed = APIConnectionError("no answer")
    request = httpx.Request("POST", "http://h/step")
    never_sent = [httpx.ConnectError("refused", request=request), httpx.ConnectTimeout("slow", request=request)]
    for cause in never_sent:  # nothing reached the server: safe for any call
        assert should_retry(failed, cause, idempotent=False)
    broken = httpx.RemoteProtocolError("server disconnected", request=request)
    assert should_retry(failed, broken, idempotent=True)
    assert not should_retry(failed, broken, idempotent=False)  # the step may have run


# --- errors -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, BadRequestError),
        (401, AuthenticationError),
        (404, NotFoundError),
        (409, ConflictError),
        (410, GoneError),
        (413, BadRequestError),
        (422, BadRequestError),
        (429, RateLimitError),
        (500, InternalServerError),
        (502, InternalServerError),
        (503, ServiceUnavailableError),
        (418, APIStatusError),
    ],
)
def test_an_error_answer_becomes_its_class_with_the_servers_fields(status: int, cls: type[APIStatusError]) -> None:
    body = {
        "error": {"code": "too_many_live_envs", "message": "256 envs are live", "retryable": True, "limit": 256},
        "detail": "256 envs are live",
    }
    error = error_from_response(httpx.Response(status, json=body, headers={"Retry-After": "2"}))
    assert type(error) is cls
    assert (error.status, error.code, error.message, error.retryable) == (
        status,
        "too_many_live_envs",
        "256 envs are live",
        True,
    )
    assert error.details == {"limit": 256}
    assert error.retry_after == 2.0
    assert str(error) == f"{status} too_many_live_envs: 256 envs are live"


def test_an_answer_that_is_not_the_apps_error_shape_keeps_its_text() -> None:
    error = error_from_response(httpx.Response(502, text="<html>bad gateway</html>"))
    assert type(error) is InternalServerError
    assert (error.code, error.retryable, error.retry_after) == ("http_502", None, None)
    assert "bad gateway" in error.message


# --- what is sent -----------------------------------------------------------------------------------


def test_actions_by_name_become_one_interact_many_call() -> None:
    expected = [{"tool_name": "interact_many", "arguments": {"actions": ["move_left", "do"]}}]
    assert tool_calls_of(["move_left", "do"]) == expected
    assert tool_calls_of("noop") == [{"tool_name": "interact_many", "arguments": {"actions": ["noop"]}}]
    with pytest.raises(ValueError, match="either"):
        tool_calls_of()


class _SdkToolCall:
    """What openai's SDK objects offer: `model_dump()`."""

    def model_dump(self) -> dict[str, Any]:
        return {"id": "c1", "type": "function", "function": {"name": "interact_many", "arguments": "{}"}}


def test_model_tool_calls_pass_as_given_without_non_call_items() -> None:
    chat = {"id": "c1", "type": "function", "function": {"name": "interact_many", "arguments": '{"actions":["do"]}'}}
    responses = [
        {"type": "reasoning", "id": "r1", "summary": []},
        {"type": "function_call", "call_id": "c2", "name": "interact_many", "arguments": '{"actions":["do"]}'},
        {"type": "message", "role": "assistant", "content": []},
    ]
    assert tool_calls_of(tool_calls=[chat]) == [chat]
    assert tool_calls_of(tool_calls=responses) == [responses[1]]
    assert tool_calls_of(tool_calls=[_SdkToolCall()])[0]["function"]["name"] == "interact_many"
    with pytest.raises(TypeError, match="mapping"):
        tool_calls_of(tool_calls=["do"])


def test_rollout_requests_get_a_run_id_once() -> None:
    built = rollout_request(seed=3, policy="crafter-react", policy_config={"model": "m"}, decisions=4)
    body = built.body()
    assert re.fullmatch(r"client-[0-9a-f]{32}", body["run_id"])
    assert body["ops"] == ["agent", "env"] * 4
    assert body["policy"] == {"policy_name": "crafter-react", "config": {"model": "m", "max_llm_calls": 4}}
    assert body["env"] == {"env_name": "crafter", "seed": 3, "config": {}}
    assert rollout_body(built) == body  # the same run_id on every attempt
    raw = rollout_body({"mode": "eval"})
    assert raw["run_id"].startswith("client-") and rollout_body({"run_id": "mine"}) == {"run_id": "mine"}
    assert RolloutRequest(run_id="r", future_option=1).body()["future_option"] == 1


# --- task ids (docs/contract.md's tasks and splits), on the wire --------------------------------------

TASKSET = {
    "taskset": {
        "id": "crafter_classic_procedural",
        "splits": ["train", "eval"],
        "task_id_format": "crafter/{split}/{index}",
        "task_splits": [
            {"name": "train", "type": "train", "num_tasks": 2147483392, "seeds": [0, 2147483391],
             "task_ids": "crafter/train/{index}"},
            {"name": "eval", "type": "test", "num_tasks": 256, "seeds": [2147483392, 2147483647],
             "task_ids": "crafter/eval/{index}"},
        ],
    }
}  # fmt: skip
TASK_INFO = {"task_id": "crafter/eval/17", "dataset": {"seed": 2147483409, "split": "eval", "task_index": 17}}
ENV = {
    "env_id": "e1",
    "observation": {"text": "Step 0/10000"},
    "info": {"seed": 2147483409, "task_id": "crafter/eval/17"},
}


def _recording(sent: list[httpx.Request]) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        if request.url.path == "/task_info":
            return httpx.Response(200, json=TASK_INFO if request.url.params else TASKSET)
        return httpx.Response(200, json=ENV if request.url.path == "/create" else {**ENV, "env_id": None})

    return httpx.MockTransport(answer)


def test_task_ids_go_where_seeds_go() -> None:
    sent: list[httpx.Request] = []
    with Client("http://app.test", "k", transport=_recording(sent)) as client:
        env = client.env(task_id="crafter/eval/17")
        assert env.info.task_id == "crafter/eval/17"
        env.reset(task_id="crafter/eval/18")
        one = client.task_info(task_id="crafter/eval/17")
        assert (one.task_id, one.split, one.seed) == ("crafter/eval/17", "eval", 2147483409)
        client.task_info(seeds=[1], task_ids=["crafter/eval/3"])
        taskset = client.task_info()
    create, reset, single, several, _ = (json.loads(request.content or b"null") for request in sent)
    assert create["task_id"] == "crafter/eval/17" and create["seed"] is None
    assert reset == {"env_id": "e1", "seed": None, "task_id": "crafter/eval/18"}
    assert sent[2].url.params.get_list("task_id") == ["crafter/eval/17"]
    assert (sent[3].url.params.get_list("seed"), sent[3].url.params.get_list("task_id")) == (["1"], ["crafter/eval/3"])
    assert taskset.splits == ["train", "eval"]
    assert taskset.split("eval").task_id(17) == "crafter/eval/17"
    assert taskset.split("eval").type == "test"
    with pytest.raises(ValueError, match="no task 256"):
        taskset.split("eval").task_id(256)
    assert rollout_request(task_id="crafter/eval/17").body()["env"] == {
        "env_name": "crafter",
        "task_id": "crafter/eval/17",
        "config": {},
    }
    with Client("http://app.test", "k", transport=_recording([])) as client:
        with pytest.raises(ValueError, match="one seed or one task_id"):
            client.task_info(seed=1, task_id="crafter/eval/1")
