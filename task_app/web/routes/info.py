"""What the task is: `/info`, and `/task_info` (the taskset, or TaskInfo per seed or task id)."""

from __future__ import annotations

import functools
from typing import Annotated, Any

from fastapi import APIRouter, Query

from ...core.errors import InvalidRequest
from ...core.tasks import TASK_ID_MAX_LENGTH
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
    task_id: Annotated[
        list[Annotated[str, Query(max_length=TASK_ID_MAX_LENGTH)]],
        Query(description="a task id such as crafter/eval/17; repeatable"),
    ] = [],  # noqa: B006
) -> JSONBytes:
    """No parameters: the taskset (splits included). Seeds and task ids: one TaskInfo each, seeds first
    (a single object when one is asked for)."""
    requested = [*seed, *seeds]
    if not requested and not task_id:
        return JSONBytes(state.taskset.describe())
    settings, tasks = state.settings, state.taskset.tasks
    if len(requested) + len(task_id) > settings.task_info_max_seeds:
        raise InvalidRequest(
            f"at most {settings.task_info_max_seeds} seeds and task ids per call, got {len(requested) + len(task_id)}",
            code="too_many_seeds",
        )
    bad = [value for value in requested if not 0 <= value <= settings.max_seed]
    if bad:
        raise InvalidRequest(f"seeds must be in [0, {settings.max_seed}]: {bad[:5]}", code="seed_out_of_range")
    wanted = [tasks.task_of_seed(value) for value in requested] + [tasks.parse(value) for value in task_id]
    infos = []
    for task in wanted:
        traits = await state.offload(functools.partial(state.traits.get, task.seed, task.area, task.length))
        infos.append(state.taskset.task_info(task, traits))
    return JSONBytes(infos[0] if len(infos) == 1 else infos)
