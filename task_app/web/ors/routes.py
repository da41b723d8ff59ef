"""The ORS routes the `openreward` client uses, each behind the key (`X-API-Key`), on the doors' tool sessions.

    GET  /health                                   liveness (public, as the main app's)
    GET  /list_environments                        ["crafter"]
    GET  /tools /splits                            the one tool, `interact_many`; the splits
    POST /tasks /num_tasks /task /task_range       the tasks of a split (core/tasks.py: train, eval)
    POST /create_session                           a new session id (server-sent events: task_id, end)
    POST /create                      X-Session-ID  the episode: a tool session on the task's world
    GET  /prompt /messages /task_tools X-Session-ID what the agent reads first; the session's tools
    POST /call                        X-Session-ID  a tool call: its reward and `finished` (server-sent events)
    POST /ping /delete /delete_session X-Session-ID keep alive; end the episode

Every path after the first three is also served under `/{env_name}/...` (`/crafter/call`), the form
the client uses when it is given a variant. Failures before a call runs are HTTP statuses with the
app's error body (its `detail` is what the client shows): 404 unknown session or environment, 410 an
env that expired, 422 bad input, 429 with `Retry-After` at a cap; a tool's own failure (unknown tool,
bad input, an episode already over) is the client's `RunToolError` inside the stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Header, Path, Request
from fastapi.responses import Response

from ...core import json_codec
from ...core.errors import BadRequest, Gone, InvalidRequest, NotFound, StoreUnavailable
from ...core.tasks import ENV_NAME, Task, Tasks
from ...game import TOOL_NAME
from ...policy.prompts import system_prompt, turn_text
from ...sessions.ors_sessions import OrsSession, OrsSessions, already_created
from ...sessions.tools import KEY_SCOPE, TOOLS
from ..auth import check_api_key
from ..responses import JSONBytes
from ..state import AppState
from ..strict_json import StrictJSONRoute
from .models import CreateEpisode, SplitQuery, TaskQuery, TaskRangeQuery, ToolCall

CHUNK_CHARS = 4096  # the client joins `chunk` events up to the `end` event
RESUME_WAIT_S = 30.0  # how long a reconnecting call waits for the answer of the call it resumes
RESUME_POLL_S = 0.05
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
MAX_LISTED_TASKS = 10_000  # /tasks answers splits up to this size; larger ones go through /num_tasks + /task
TOOL = TOOLS[TOOL_NAME]  # the one tool ORS offers: an episode is played, never restarted, by the model


def _state(request: Request) -> AppState:
    """The main app's shared objects (the ORS app's `state.main`); 503 while its lifespan has not made them yet."""
    state: AppState | None = getattr(request.app.state.main.state, "task_app", None)
    if state is None:
        raise StoreUnavailable("the task app is starting; retry in a moment", code="starting")
    return state


async def _authorised(request: Request) -> AppState:
    state = _state(request)
    check_api_key(request, state.settings)
    return state


State = Annotated[AppState, Depends(_authorised)]
SessionId = Annotated[str | None, Header(alias="X-Session-ID", max_length=128)]
EnvName = Annotated[str, Path(max_length=64)]


def _sid(value: str | None) -> str:
    if not value or not value.strip():
        raise BadRequest("the X-Session-ID header is required (from POST /create_session)", code="missing_session_id")
    return value.strip()


def _env(name: str | None) -> None:
    if name is not None and name.lower() != ENV_NAME:
        raise NotFound(f"unknown environment; this server serves {ENV_NAME!r}", code="unknown_environment")


def _ors(state: AppState) -> OrsSessions:
    return OrsSessions(state.sessions.store, state.settings.sessions_ttl_s)


def _tasks(state: AppState) -> Tasks:
    return state.sessions.tools.tasks


# --- discovery -----------------------------------------------------------------------------------

router = APIRouter(route_class=StrictJSONRoute)


@router.get("/health")
async def health() -> JSONBytes:
    return JSONBytes({"status": "ok"})


@router.get("/list_environments")
async def list_environments(state: State) -> JSONBytes:
    return JSONBytes([ENV_NAME])


def _tools_body(state: AppState) -> dict[str, Any]:
    tool = {
        "name": TOOL.name,
        "description": TOOL.description,
        "input_schema": TOOL.input_schema(state.settings.max_actions_per_decision),
    }
    return {"tools": [tool], "terminal_tool": None, "supports_score_group": False, "message_block_types": ["text"]}


async def tools(state: State) -> JSONBytes:
    return JSONBytes(_tools_body(state))


async def splits(state: State) -> JSONBytes:
    return JSONBytes([{"name": split.name, "type": split.kind} for split in _tasks(state).splits.values()])


def _listed(tasks: list[Task]) -> JSONBytes:
    return JSONBytes({"tasks": [task.as_dict() for task in tasks], "env_name": ENV_NAME})


async def tasks(body: SplitQuery, state: State) -> JSONBytes:
    split = _tasks(state).split(body.split)
    if split.size > MAX_LISTED_TASKS:
        raise InvalidRequest(
            f"the {split.name} split has {split.size} tasks, too many to list: use /num_tasks and /task "
            "(or /task_range)",
            code="too_many_tasks",
        )
    return _listed(_tasks(state).page(split.name, None, None, MAX_LISTED_TASKS))


async def num_tasks(body: SplitQuery, state: State) -> JSONBytes:
    return JSONBytes({"num_tasks": _tasks(state).split(body.split).size})


async def task(body: TaskQuery, state: State) -> JSONBytes:
    return JSONBytes({"task": _tasks(state).task(body.split, body.index).as_dict(), "env_name": ENV_NAME})


async def task_range(body: TaskRangeQuery, state: State) -> JSONBytes:
    return _listed(_tasks(state).page(body.split, body.start, body.stop, state.settings.task_info_max_seeds))


# --- sessions ------------------------------------------------------------------------------------


def _events(*events: tuple[str, str]) -> bytes:
    return b"".join(f"event: {name}\ndata: {data}\n\n".encode() for name, data in events)


def _event_answer(task_id: str, answer: str) -> Response:
    """`task_id`, then the answer in `chunk` events closed by `end`, as the client reassembles them: an
    event stream whose every event is known when it starts, so it is sent whole, with its length."""
    parts = [answer[start : start + CHUNK_CHARS] for start in range(0, len(answer), CHUNK_CHARS)] or [""]
    events = [("task_id", task_id)] + [("chunk", part) for part in parts[:-1]] + [("end", parts[-1])]
    return Response(_events(*events), media_type="text/event-stream", headers=SSE_HEADERS)


@router.post("/create_session")
async def create_session(state: State) -> Response:
    sid = OrsSessions.new_sid()
    return _event_answer(sid, json_codec.dumps({"sid": sid}))


async def _session(state: AppState, sid: str | None) -> OrsSession:
    return await _ors(state).get(_sid(sid))


def _task_of_spec(state: AppState, spec: dict[str, Any]) -> Task:
    task_id = spec.get("task_id")
    if not isinstance(task_id, str):
        raise InvalidRequest("task_spec must be a task from /tasks or /task (it carries its task_id)")
    return _tasks(state).parse(task_id)


@router.post("/create")
async def create(body: CreateEpisode, state: State, x_session_id: SessionId = None) -> JSONBytes:
    sid = _sid(x_session_id)
    _env(body.env_name)
    if body.toolset_name is not None:
        raise BadRequest("this environment has no toolsets; leave toolset_name unset", code="unknown_toolset")
    if body.task_spec is not None:
        chosen = _task_of_spec(state, body.task_spec)
    else:  # the model's validator: split and index are both given
        chosen = _tasks(state).task(str(body.split), int(body.index or 0))
    tools = state.sessions.tools
    session_id, _ = await tools.open(KEY_SCOPE, task_id=chosen.task_id)
    if not await _ors(state).bind(sid, session_id, chosen.as_dict()):
        with anyio.CancelScope(shield=True), suppress(NotFound, Gone):
            await tools.close(KEY_SCOPE, session_id)
        raise already_created()
    return JSONBytes({"sid": sid})


def _blocks(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text, "detail": None}]


async def _first_turn(state: AppState, session: OrsSession) -> str:
    view = await state.sessions.tools.state(KEY_SCOPE, session.session_id)
    return turn_text(view.observation.text, state.settings.max_actions_per_decision)


async def prompt(state: State, x_session_id: SessionId = None) -> JSONBytes:
    session = await _session(state, x_session_id)
    rules = system_prompt(state.settings.max_actions_per_decision)
    return JSONBytes(_blocks(f"{rules}\n\n{await _first_turn(state, session)}"))


async def messages(state: State, x_session_id: SessionId = None) -> JSONBytes:
    session = await _session(state, x_session_id)
    rules = system_prompt(state.settings.max_actions_per_decision)
    turn = await _first_turn(state, session)
    return JSONBytes(
        [
            {"role": "system", "blocks": _blocks(rules), "detail": None},
            {"role": "user", "blocks": _blocks(turn), "detail": None},
        ]
    )


async def task_tools(state: State, x_session_id: SessionId = None) -> JSONBytes:
    await _session(state, x_session_id)
    return JSONBytes(_tools_body(state))


def _tool_error(message: str, reason: str) -> str:
    return json_codec.dumps({"ok": False, "error": message, "reason": reason})


async def _run_tool(state: AppState, session: OrsSession, name: str, given: dict[str, Any]) -> str:
    """The call's answer, as the client's `RunToolOutput` JSON."""
    if name != TOOL_NAME:
        return _tool_error(f"{name!r} is not a valid tool; this environment has {TOOL_NAME!r}", "not_found")
    try:
        result = await state.sessions.tools.call(KEY_SCOPE, session.session_id, TOOL_NAME, given)
    except InvalidRequest as exc:
        if exc.code != "invalid_tool_arguments":
            raise
        return _tool_error(f"Tool input validation error: {exc.message}", "input_validation")
    if result.data.get("episode_over"):
        return _tool_error("the episode is over; delete this session and start another", "episode_finished")
    output = {
        "blocks": _blocks(result.text),
        "metadata": result.structured(),
        "reward": result.reward,
        "finished": result.done,
    }
    return json_codec.dumps({"ok": True, "output": output})


async def _resumed(ors: OrsSessions, task_id: str) -> str:
    """The answer of an earlier call, stored when it finished (on whichever process ran it)."""
    with anyio.move_on_after(RESUME_WAIT_S):
        while True:
            answer = await ors.answer(task_id)
            if answer is not None:
                return answer.decode()
            await anyio.sleep(RESUME_POLL_S)  # the polling interval of a resumed call
    raise NotFound("unknown task_id (its answer is no longer kept)", code="ors_call_not_found")


async def call(body: ToolCall, state: State, x_session_id: SessionId = None) -> Response:
    session = await _session(state, x_session_id)
    ors = _ors(state)
    if body.task_id is not None:
        return _event_answer(body.task_id, await _resumed(ors, body.task_id))
    task_id = ors.new_call_id()
    with anyio.CancelScope(shield=True):  # a step that ran is answered, even to a client that reconnects
        answer = await _run_tool(state, session, body.name, body.input)
        await ors.keep_answer(task_id, answer.encode())
    return _event_answer(task_id, answer)


async def ping(state: State, x_session_id: SessionId = None) -> JSONBytes:
    session = await _session(state, x_session_id)
    await state.sessions.tools.state(KEY_SCOPE, session.session_id)  # refreshes the idle TTL (410 once expired)
    return JSONBytes({"status": "ok"})


async def delete(state: State, x_session_id: SessionId = None) -> JSONBytes:
    sid = _sid(x_session_id)
    session = await _ors(state).unbind(sid)
    if session is not None:
        with anyio.CancelScope(shield=True), suppress(NotFound, Gone):
            await state.sessions.tools.close(KEY_SCOPE, session.session_id)
    return JSONBytes({"sid": sid})


async def _named(env_name: EnvName) -> None:
    _env(env_name)


def _add(paths: Sequence[str], methods: list[str], handler: Any) -> None:
    for path in paths:
        router.add_api_route(path, handler, methods=methods)
        router.add_api_route(f"/{{env_name}}{path}", handler, methods=methods, dependencies=[Depends(_named)])


for _name, _methods, _handler in (
    ("tools", ["GET"], tools),
    ("splits", ["GET"], splits),
    ("tasks", ["POST"], tasks),
    ("num_tasks", ["POST"], num_tasks),
    ("task", ["POST"], task),
    ("task_range", ["POST"], task_range),
    ("prompt", ["GET"], prompt),
    ("messages", ["GET"], messages),
    ("task_tools", ["GET"], task_tools),
    ("call", ["POST"], call),
):
    _add([f"/{_name}"], _methods, _handler)

for _path, _handler in (("/ping", ping), ("/delete", delete), ("/delete_session", delete)):
    router.add_api_route(_path, _handler, methods=["POST"])
