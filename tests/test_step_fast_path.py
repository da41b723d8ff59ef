"""The step path beside FastAPI (web/step_fast_path.py) on real servers: it answers a well-formed step
itself, hands everything else to the app, and every answer, error or not, is byte for byte the route's."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from support.errors import error_body
from support.servers import AppServer

from task_app.core.env_contracts import MAX_TOOL_CALLS
from task_app.core.errors import Conflict
from task_app.web.deps import require_api_key
from task_app.web.step_fast_path import STEP_PATHS

pytestmark = [pytest.mark.usefixtures("no_key_in_logs"), pytest.mark.e2e]

JSON = {"Content-Type": "application/json"}
MOVE = b'[{"tool": "interact_many", "args": {"actions": ["move_left", "do"]}}]'


def _create(server: AppServer, seed: int) -> str:
    response = server.client().post("/create", json={"env_name": "crafter", "seed": seed})
    assert response.status_code == 200, response.text
    env_id: str = response.json()["env_id"]
    return env_id


def _body(env_id: str, tool_calls: bytes = MOVE, extra: bytes = b"") -> bytes:
    return b'{"env_id": "%s", "tool_calls": %s%s}' % (env_id.encode(), tool_calls, extra)


def _chunks(data: bytes) -> Iterator[bytes]:
    yield data[:10]
    yield data[10:]


def _cases(env_id: str, ended_id: str) -> list[tuple[str, str, dict[str, str], Any]]:
    """(name, path, headers, content): the same requests, sent to both servers."""
    step = _body(env_id)
    return [
        ("a step", "/step", JSON, step),
        ("the hosted mount", "/env/step", JSON, step),
        ("a compact observation", "/step", JSON, _body(env_id, extra=b', "observation": "compact"')),
        ("fields the route ignores", "/step", JSON, _body(env_id, extra=b', "unknown": [1, 2]')),
        ("a charset", "/step", {"Content-Type": "application/json; charset=utf-8"}, step),
        ("a +json type", "/step", {"Content-Type": "application/vnd.step+json"}, step),
        ("compressed", "/step", {**JSON, "Accept-Encoding": "gzip"}, step),
        ("no content type", "/step", {}, step),
        ("text/plain", "/step", {"Content-Type": "text/plain"}, step),
        ("a chunked body", "/step", JSON, _chunks(step)),
        ("no key", "/step", {**JSON, "X-API-Key": ""}, step),
        ("a wrong key", "/step", {**JSON, "X-API-Key": "not-the-key"}, step),
        ("invalid JSON", "/step", JSON, b'{"env_id": '),
        ("NaN", "/step", JSON, _body(env_id, extra=b', "x": NaN')),
        ("an array", "/step", JSON, b"[1, 2]"),
        ("no env_id", "/step", JSON, b'{"tool_calls": []}'),
        ("an env_id that is a number", "/step", JSON, b'{"env_id": 7, "tool_calls": []}'),
        ("too many tool calls", "/step", JSON, _body(env_id, b"[%s]" % b", ".join([b"{}"] * (MAX_TOOL_CALLS + 1)))),
        ("an unknown action", "/step", JSON, _body(env_id, b'[{"tool": "interact", "args": {"action": "fly"}}]')),
        ("an unknown env", "/step", JSON, _body("env-that-does-not-exist")),
        ("a terminated env", "/step", JSON, _body(ended_id)),
        ("a trailing slash", "/step/", JSON, step),
        ("another step", "/step", JSON, step),
    ]


def _normalised(response: httpx.Response, env_ids: tuple[str, str]) -> tuple[int, str | None, str | None, str]:
    text = response.text
    for env_id in env_ids:
        text = text.replace(env_id, "<env>")
    return response.status_code, response.headers.get("content-type"), response.headers.get("content-encoding"), text


def test_every_answer_is_the_routes_own(make_app_server: Callable[..., AppServer]) -> None:
    """The same requests to a server with the path and one without it: the same status, type, encoding
    and body (env ids aside), for steps and for every way a step can be wrong."""
    # Every body compressed for a client that accepts it, so the gzip case checks the encoding too.
    servers = [make_app_server(step_fast_path=on, gzip_min_bytes=0) for on in (True, False)]
    answers: list[list[tuple[int, str | None, str | None, str]]] = []
    for server in servers:
        env_id, ended_id = _create(server, 3), _create(server, 4)
        assert server.client().post("/terminate", json={"env_id": ended_id}).status_code == 200
        http = server.client(guard=False)
        answers.append(
            [
                _normalised(http.post(path, headers=headers, content=content), (env_id, ended_id))
                for _, path, headers, content in _cases(env_id, ended_id)
            ]
        )
    names = [name for name, *_ in _cases("e", "f")]
    for name, fast, routed in zip(names, *answers, strict=True):
        assert fast == routed, name
    statuses = dict(zip(names, (status for status, *_ in answers[0]), strict=True))
    assert statuses["a step"] == statuses["compressed"] == statuses["a chunked body"] == 200
    assert answers[0][names.index("compressed")][2] == "gzip"
    assert {statuses[name] for name in ("no key", "a wrong key")} == {401}
    assert statuses["invalid JSON"] == statuses["NaN"] == 400
    assert statuses["an unknown env"] == 404


def test_well_formed_steps_are_answered_beside_the_routes(make_app_server: Callable[..., AppServer]) -> None:
    """With the routes' auth dependency overridden to refuse everything, a well-formed step is still
    answered (by this path, which checks the key itself), and what it hands on reaches the route."""
    server = make_app_server()
    env_id = _create(server, 3)

    async def routed() -> None:
        raise Conflict("this request reached the route", code="routed")

    server.app.dependency_overrides[require_api_key] = routed
    http = server.client()
    for path in sorted(STEP_PATHS):
        answered = http.post(path, headers=JSON, content=_body(env_id))
        assert answered.status_code == 200, answered.text
        assert answered.json()["observation"]["text"].startswith("Step ")
        error_body(http.post(path, headers={}, content=_body(env_id)), 409, "routed")
        error_body(http.post(path, headers={**JSON, "X-API-Key": "wrong"}, content=_body(env_id)), 409, "routed")
        error_body(http.post(path, headers=JSON, content=_chunks(_body(env_id))), 409, "routed")


def test_a_body_over_the_limit_is_refused_before_it(make_app_server: Callable[..., AppServer]) -> None:
    server = make_app_server(max_body_bytes=1024)
    env_id = _create(server, 3)
    padding = b', "padding": "%s"' % (b"x" * 2048)
    http = server.client()
    error_body(http.post("/step", headers=JSON, content=_body(env_id, extra=padding)), 413, "payload_too_large")
    error_body(http.post("/step", headers=JSON, content=_chunks(_body(env_id, extra=padding))), 413)
    assert http.post("/step", headers=JSON, content=_body(env_id)).status_code == 200
