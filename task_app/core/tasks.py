"""Tasks, splits and task ids: the worlds this app offers, named the same way at every door.

A task is a world: a seed plus the world config (area, episode length) of this deployment. Two splits
cover the 31-bit seed range, disjoint:

    train   index i  -> seed i                      0 <= i < TRAIN_SIZE (at most TASKAPP_MAX_SEED + 1)
    eval    index k  -> seed EVAL_FIRST_SEED + k    0 <= k < EVAL_SIZE: the last 256 seeds, held out

    task id     <env>/<split>/<index>      e.g. crafter/train/3, crafter/eval/17
                env: crafter (case-insensitive); split: train | eval; index: decimal, no leading zeros

Every seed in range is exactly one task (`task_of_seed`), a request may name a world by seed, by task
id or both (they must agree), and a seed drawn for a request that names neither comes from train.
The eval seeds do not depend on TASKAPP_MAX_SEED: the set is fixed, whatever the deployment.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Any

from .errors import InvalidRequest, UnknownName
from .settings import MAX_SEED, Settings

ENV_NAME = "crafter"
TRAIN, EVAL = "train", "eval"
EVAL_SIZE = 256
EVAL_FIRST_SEED = MAX_SEED + 1 - EVAL_SIZE  # 2_147_483_392
TASK_ID_FORMAT = ENV_NAME + "/{split}/{index}"
TASK_ID_MAX_LENGTH = 64
_TASK_ID = re.compile(r"^([^/\s]{1,32})/([^/\s]{1,32})/(0|[1-9][0-9]{0,9})$")


@dataclass(frozen=True, slots=True)
class Split:
    name: str
    kind: str  # the Open Reward Standard's split type: train | validation | test
    first_seed: int
    size: int

    def seed(self, index: int) -> int:
        return self.first_seed + index

    def index_of(self, seed: int) -> int | None:
        index = seed - self.first_seed
        return index if 0 <= index < self.size else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.kind,
            "num_tasks": self.size,
            "seeds": [self.first_seed, self.first_seed + self.size - 1],
            "task_ids": TASK_ID_FORMAT.format(split=self.name, index="{index}"),
        }


@dataclass(frozen=True, slots=True)
class Task:
    split: str
    index: int
    seed: int
    area: tuple[int, int]
    length: int

    @property
    def task_id(self) -> str:
        return TASK_ID_FORMAT.format(split=self.split, index=self.index)

    def as_dict(self) -> dict[str, Any]:
        """The task as every door serves it (OpenEnv Task API, ORS, /task_info)."""
        return {
            "task_id": self.task_id,
            "env_name": ENV_NAME,
            "split": self.split,
            "index": self.index,
            "seed": self.seed,
            "config": {"area": list(self.area), "length": self.length},
        }


class Tasks:
    """The splits of one deployment (its settings fix train's size and every task's config)."""

    def __init__(self, settings: Settings) -> None:
        self.area = (int(settings.area[0]), int(settings.area[1]))
        self.length = settings.episode_length
        train_size = min(settings.max_seed + 1, EVAL_FIRST_SEED)
        self.splits = {
            TRAIN: Split(TRAIN, "train", 0, train_size),
            EVAL: Split(EVAL, "test", EVAL_FIRST_SEED, EVAL_SIZE),
        }

    def split(self, name: object) -> Split:
        split = self.splits.get(name) if isinstance(name, str) else None
        if split is None:
            raise InvalidRequest(
                f"unknown split {name!r}; this app has {', '.join(map(repr, self.splits))}", code="unknown_split"
            )
        return split

    def task(self, split_name: object, index: int) -> Task:
        split = self.split(split_name)
        if not 0 <= index < split.size:
            raise InvalidRequest(
                f"task index {index} is out of range: split {split.name!r} has tasks 0..{split.size - 1}",
                code="task_index_out_of_range",
            )
        return Task(split.name, index, split.seed(index), self.area, self.length)

    def parse(self, task_id: object) -> Task:
        """The task a task id names; 422 `invalid_task_id`, `unknown_env`, `unknown_split` or
        `task_index_out_of_range`."""
        match = _TASK_ID.match(task_id) if isinstance(task_id, str) else None
        if match is None:
            shown = task_id if isinstance(task_id, str) and len(task_id) <= TASK_ID_MAX_LENGTH else "the value"
            raise InvalidRequest(
                f"task_id {shown!r} is malformed: expected {TASK_ID_FORMAT.format(split='<split>', index='<index>')}"
                f", e.g. {ENV_NAME}/eval/17",
                code="invalid_task_id",
            )
        env, split, index = match.groups()
        if env.lower() != ENV_NAME:
            raise UnknownName(
                f"task_id {task_id!r}: unknown env {env!r}; this app serves {ENV_NAME!r}", code="unknown_env"
            )
        return self.task(split, int(index))

    def task_of_seed(self, seed: int) -> Task:
        """The task whose world a seed is; 422 `seed_out_of_range` for a seed in neither split."""
        for split in self.splits.values():
            index = split.index_of(seed)
            if index is not None:
                return Task(split.name, index, seed, self.area, self.length)
        train = self.splits[TRAIN]
        raise InvalidRequest(
            f"seed {seed} is in no split: train is [0, {train.size - 1}], eval [{EVAL_FIRST_SEED}, {MAX_SEED}]",
            code="seed_out_of_range",
        )

    def resolve(self, task_id: str | None, seed: int | None, *, where: str = "") -> Task | None:
        """The task a request names by `task_id` (None when it names none); 422 `task_seed_mismatch`
        when it also sends a seed that is not that task's."""
        if task_id is None:
            return None
        task = self.parse(task_id)
        if seed is not None and seed != task.seed:
            raise InvalidRequest(
                f"{where}seed {seed} and {where}task_id {task_id!r} disagree: that task is seed {task.seed}; "
                "send one of them",
                code="task_seed_mismatch",
            )
        return task

    def random_train_seed(self) -> int:
        return secrets.randbelow(self.splits[TRAIN].size)

    def page(self, split_name: object, start: int | None, stop: int | None, limit: int) -> list[Task]:
        """Tasks `split[start:stop]` (Python slice bounds); 422 `too_many_tasks` past `limit`."""
        split = self.split(split_name)
        first, last, _ = slice(start, stop).indices(split.size)
        count = max(0, last - first)
        if count > limit:
            raise InvalidRequest(
                f"{count} tasks asked for; at most {limit} per call (TASKAPP_TASK_INFO_MAX_SEEDS): "
                "page with start and stop",
                code="too_many_tasks",
            )
        return [Task(split.name, index, split.seed(index), self.area, self.length) for index in range(first, last)]

    def describe(self) -> dict[str, Any]:
        """The splits, for /info and /task_info."""
        return {
            "task_id_format": TASK_ID_FORMAT.format(split="{split}", index="{index}"),
            "task_splits": [split.as_dict() for split in self.splits.values()],
        }


def check_area(task: Task | None, area: tuple[int, int], *, where: str = "config.area") -> None:
    """A task's world has the deployment's area: a request for another area is another world (422)."""
    if task is not None and tuple(area) != task.area:
        raise InvalidRequest(
            f"{where} {list(area)} is not the area of task {task.task_id!r} ({list(task.area)}); "
            "name the world by seed to play another area",
            code="task_config_mismatch",
        )
