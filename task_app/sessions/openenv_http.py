"""OpenEnv's HTTP reset / step / state on tool sessions, for both doors (API key or token).

A request names its session with `session_id` (body; `?session_id=` for state), as MCPToolClient's
`openenv/session/create` made it or a reset answered it (`metadata.session_id`). Without one, a token
drives its own session: the first reset creates it and binds it to the token (put_if_absent: one per
token across the fleet, whichever process served the reset), later resets reset it, steps step it. With
the API key and no session, a reset opens a new session and step / state need the id. So unlike stock
OpenEnv, whose HTTP routes build a throw-away env per request, a client can play an episode over plain
HTTP, and any process can serve each request.
"""

from __future__ import annotations

from typing import Any

from ..core.errors import Conflict, Gone, InvalidRequest, NotFound
from .openenv import CrafterAction, ResetRequest, observation_payload, state_payload
from .openenv_mcp import Door
from .openenv_tokens import TokenInfo, TokenRegistry
from .tools import ToolSessions


async def http_reset(
    tools: ToolSessions, tokens: TokenRegistry, door: Door, info: TokenInfo | None, request: ResetRequest
) -> dict[str, Any]:
    scope, task_id, seed, episode_id = door.scope, request.task_id, request.seed, request.episode_id
    session_id = request.session_id or (await tokens.bound_session(info) if info is not None else None)
    if session_id is not None:
        try:
            view = await tools.reset(scope, session_id, task_id=task_id, seed=seed, episode_id=episode_id)
            return observation_payload(view, stepped=False, session_id=session_id)
        except (NotFound, Gone):
            if request.session_id is not None:
                raise
            # the token outlived its session (expired or closed): start a new one
    default_seed = door.seed if task_id is None else None
    session_id, view = await tools.open(
        scope,
        task_id=task_id,
        seed=seed if seed is not None else default_seed,
        config=door.config,
        episode_id=episode_id,
    )
    if info is not None:
        bound = await tokens.bound_session(info)
        winner = await tokens.bind_session(info, session_id, replace=bound is not None)
        if winner != session_id:  # another process bound a session first: use that one
            await tools.close(scope, session_id)
            session_id = winner
            view = await tools.reset(scope, winner, task_id=task_id, seed=seed, episode_id=episode_id)
    return observation_payload(view, stepped=False, session_id=session_id)


async def _session(tokens: TokenRegistry, info: TokenInfo | None, session_id: str | None) -> str:
    if session_id is not None:
        return session_id
    bound = await tokens.bound_session(info) if info is not None else None
    if bound is not None:
        return bound
    if info is None:
        raise InvalidRequest(
            "session_id is required: the reset that started the episode answered it (metadata.session_id)",
            code="missing_session_id",
        )
    raise Conflict("this token has no env yet: POST reset first", code="not_reset")


async def http_step(
    tools: ToolSessions,
    tokens: TokenRegistry,
    door: Door,
    info: TokenInfo | None,
    action: CrafterAction,
    session_id: str | None,
) -> dict[str, Any]:
    session_id = await _session(tokens, info, session_id)
    view = await tools.step(door.scope, session_id, action.tool_calls_for_env())
    return observation_payload(view, stepped=True, session_id=session_id)


async def http_state(
    tools: ToolSessions, tokens: TokenRegistry, door: Door, info: TokenInfo | None, session_id: str | None
) -> dict[str, Any]:
    if session_id is None and info is not None and await tokens.bound_session(info) is None:
        return state_payload(None)
    session_id = await _session(tokens, info, session_id)
    return state_payload(await tools.state(door.scope, session_id), session_id)
