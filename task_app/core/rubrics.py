"""The two rubrics this task advertises, loaded read-only and validated.

They are package data (`task_app/data/rubrics/`, the one copy; the project's top-level `rubrics/` is a
link to it), read through `importlib.resources`, so a checkout, an installed wheel and the Modal image
read the same two files; `TASKAPP_RUBRICS_DIR` points elsewhere. A broken rubric stops start-up with a
message naming the file and the field.
"""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .json_codec import JSONDecodeError, loads

RUBRIC_FILES = {"outcome": "crafter_outcome_rubric.json", "events": "crafter_events_rubric.json"}


class RubricError(RuntimeError):
    """A rubric file is missing or invalid."""


class Criterion(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1)
    description: str = Field(min_length=1)
    weight: float = Field(default=1.0, gt=0)
    required: bool = False


class Rubric(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: str = Field(min_length=1)
    goal_text: str | None = None
    criteria: list[Criterion] = Field(min_length=1)
    aggregation: Literal["sum", "weighted_sum", "custom", "inherit"] = "weighted_sum"

    @field_validator("criteria")
    @classmethod
    def _unique_ids(cls, criteria: list[Criterion]) -> list[Criterion]:
        ids = [criterion.id for criterion in criteria]
        duplicates = sorted({name for name in ids if ids.count(name) > 1})
        if duplicates:
            raise ValueError(f"duplicate criterion ids: {', '.join(duplicates)}")
        return criteria


def packaged_rubrics() -> Traversable:
    """The rubric files the package carries."""
    return resources.files("task_app") / "data" / "rubrics"


def load_rubric(path: Path | Traversable) -> Rubric:
    try:
        raw = loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise RubricError(f"{path}: rubric file not found") from exc
    except JSONDecodeError as exc:
        raise RubricError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    try:
        return Rubric.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"]) or "(top level)"
        raise RubricError(f"{path}: field {field}: {error['msg']}") from exc


def load_rubrics(directory: Path | None) -> dict[str, Rubric]:
    root = directory if directory is not None else packaged_rubrics()
    return {kind: load_rubric(root / name) for kind, name in RUBRIC_FILES.items()}
