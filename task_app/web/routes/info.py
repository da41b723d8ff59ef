"""What the task is: `/info` and per-seed `/task_info`."""

from __future__ import annotations

import functools
from typing import Annotated, Any

from fastapi import APIRouter, Query

from ...core.errors import InvalidRequest
from ..deps import AuthDep, StateDep
from ..openapi import PROTECTED, errors, ok
from ..responses import JSONBytes

router = APIRouter(tags=["info"], dependencies=[AuthDep], responses=errors(*PROTECTED))


@router.get("/info", responses=ok(dict[str, Any]))
async def info(state: StateDep) -> JSONBytes:
    return JSONBytes(state.taskset.info())


@router.get("/task_info", responses={**ok(dict[str, Any] | list[dict[str, Any]]), **errors(422)})
async def task_info(
    state: StateDep,
    seed: Annotated[list[int], Query()] = [],  # noqa: B006 - FastAPI copies query defaults
    seeds: Annotated[list[int], Query()] = [],  # noqa: B006
) -> JSONBytes:
    requested = [*seed, *seeds]
    if not requested:
        return JSONBytes(state.taskset.describe())
    settings = state.settings
    if len(requested) > settings.task_info_max_seeds:
        raise InvalidRequest(
            f"at most {settings.task_info_max_seeds} seeds per call, got {len(requested)}", code="too_many_seeds"
        )
    bad = [value for value in requested if not 0 <= value <= settings.max_seed]
    if bad:
        raise InvalidRequest(f"seeds must be in [0, {settings.max_seed}]: {bad[:5]}", code="seed_out_of_range")
    area, length = settings.area, settings.episode_length
    infos = []
    for value in requested:
        traits = await state.offload(functools.partial(state.traits.get, value, area, length))
        infos.append(state.taskset.task_info(value, traits))
    return JSONBytes(infos[0] if len(infos) == 1 else infos)
