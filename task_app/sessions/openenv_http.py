"""OpenEnv's HTTP reset / step / state for one session token: the token's env is an env session.

The first reset creates the env and binds it to the token (put_if_absent: one env per token across
the fleet, whichever process served the reset); later resets reset it, steps step it. So unlike stock
OpenEnv, whose HTTP routes build a throw-away env per request, a client can play an episode over
plain HTTP, and any process can serve each request.
"""

from __future__ import annotations

from typing import Any

from ..core.errors import Conflict, Gone, NotFound
from ..core.settings import Settings
from .env_spec import build_spec
from .manager import EnvSessions
from .openenv import CrafterAction, ResetRequest, observation_payload, state_payload
from .openenv_tokens import TokenInfo, TokenRegistry


async def http_reset(
    envs: EnvSessions, tokens: TokenRegistry, settings: Settings, info: TokenInfo, request: ResetRequest
) -> dict[str, Any]:
    seed = request.seed if request.seed is not None else info.seed
    bound = await tokens.bound_env(info)
    if bound is not None:
        try:
            return observation_payload(await envs.reset(bound, seed), stepped=False)
        except (NotFound, Gone):
            pass  # the token outlived its env (expired or terminated): start a new one
    view = await envs.create(build_spec("crafter", info.config, seed, None, settings))
    winner = await tokens.bind_env(info, view.env_id, replace=bound is not None)
    if winner != view.env_id:  # another process bound an env first: use that one
        await envs.terminate(view.env_id)
        view = await envs.reset(winner, seed)
    return observation_payload(view, stepped=False)


async def _bound(tokens: TokenRegistry, info: TokenInfo) -> str:
    bound = await tokens.bound_env(info)
    if bound is None:
        raise Conflict("this token has no env yet: POST reset first", code="not_reset")
    return bound


async def http_step(envs: EnvSessions, tokens: TokenRegistry, info: TokenInfo, action: CrafterAction) -> dict[str, Any]:
    view = await envs.step(await _bound(tokens, info), action.tool_calls_for_env())
    return observation_payload(view, stepped=True)


async def http_state(envs: EnvSessions, tokens: TokenRegistry, info: TokenInfo) -> dict[str, Any]:
    bound = await tokens.bound_env(info)
    return state_payload(await envs.state(bound) if bound is not None else None)
