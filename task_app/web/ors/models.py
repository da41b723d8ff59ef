"""The Open Reward Standard's wire shapes, as the `openreward` SDK (0.1.x) sends and reads them.

Requests are strict (unknown keys refused, as the SDK's own server does); `X-Secrets`, which the client
sends with its key inside, is never read. Responses are built as plain dicts by the routes; these models
document them and `tests/test_ors_door.py` validates live answers with the SDK's own pydantic models.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

MAX_NAME = 128
MAX_INPUT_KEYS = 16


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateEpisode(_Strict):
    """`POST /create`: the task, as a spec from `/tasks` (`task_spec`) or as `split` + `index`."""

    env_name: str | None = Field(default=None, max_length=MAX_NAME)
    task_spec: dict[str, Any] | None = None
    split: str | None = Field(default=None, max_length=MAX_NAME)
    index: StrictInt | None = None
    toolset_name: str | None = Field(default=None, max_length=MAX_NAME)

    @model_validator(mode="after")
    def _one_task_source(self) -> CreateEpisode:
        by_index = self.split is not None or self.index is not None
        if (self.task_spec is not None) == by_index:
            raise ValueError("give either task_spec, or split and index")
        if by_index and (self.split is None or self.index is None):
            raise ValueError("split and index go together")
        return self


class SplitQuery(_Strict):
    split: str = Field(max_length=MAX_NAME)


class TaskQuery(_Strict):
    split: str = Field(max_length=MAX_NAME)
    index: StrictInt


class TaskRangeQuery(_Strict):
    split: str = Field(max_length=MAX_NAME)
    start: StrictInt | None = None
    stop: StrictInt | None = None


class ToolCall(_Strict):
    """`POST /call`: a tool and its input; `task_id` resumes a call whose stream was cut."""

    name: str = Field(max_length=MAX_NAME)
    input: dict[str, Any] = Field(max_length=MAX_INPUT_KEYS)
    task_id: str | None = Field(default=None, max_length=64)


class TextBlock(BaseModel):
    type: Literal["text"] = "text"
    text: str
    detail: dict[str, Any] | None = None


class ToolSpec(BaseModel):
    name: str
    description: str
    input_schema: dict[str, Any] | None


class ToolOutput(BaseModel):
    """One call's result: the observation as blocks, crafter's reward for the call, `finished` at the end."""

    blocks: list[TextBlock]
    metadata: dict[str, Any] | None = None
    reward: float | None = None
    finished: bool = False


class Split(BaseModel):
    name: str
    type: Literal["train", "validation", "test"]
