"""Typed answers of the app's routes.

Every model keeps the fields it does not know (`extra="allow"`, reachable as attributes and in
`model_extra`): the server evolves, and a newer server must never break an older client. Fields the
app may leave out have defaults.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

FINISHED = frozenset({"completed", "aborted", "failed", "lost"})


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow")


# --- env sessions -------------------------------------------------------------------------------


class Observation(_Answer):
    """What the env shows: `text` (the model's view) and the structured state (docs/client.md)."""

    text: str = ""
    inventory: dict[str, int] = Field(default_factory=dict)
    achievements_status: dict[str, bool] = Field(default_factory=dict)
    achievements_counts: dict[str, int] = Field(default_factory=dict)
    player_position: list[int] | None = None
    player_direction: list[int] | None = None
    semantic_map_patch7: list[list[int]] | None = None
    num_steps_taken: int | None = None
    max_steps_episode: int | None = None
    terminated: bool | None = None
    truncated: bool | None = None
    observation_image_base64: str | None = None  # only for envs created with config.image_size

    @property
    def achievements(self) -> list[str]:
        """The achievements unlocked so far in this episode."""
        return [name for name, unlocked in self.achievements_status.items() if unlocked]


class EnvInfo(_Answer):
    seed: int | None = None
    task_id: str | None = None  # the world's task id (e.g. crafter/eval/17); None for a non-default area
    episode: int | None = None
    done: bool = False


class Rejection(_Answer):
    """An item of a step's tool calls that did not become an action, and why."""

    item: str
    reason: str


class StepInfo(EnvInfo):
    achievements_added: list[str] = Field(default_factory=list)
    actions: list[str] = Field(default_factory=list)  # the crafter actions this step ran
    rejected: list[Rejection] = Field(default_factory=list)
    noop_fallback: bool = False  # nothing was executable: the step ran `noop`
    terminated: bool = False
    episode_over: bool = False


class EnvState(_Answer):
    """An env as create, restore and reset leave it (reset's answer has no `env_id`)."""

    env_id: str | None = None
    observation: Observation
    info: EnvInfo = Field(default_factory=EnvInfo)
    step_idx: int = 0


class StepResult(_Answer):
    """One step: `reward` is crafter's (achievements unlocked, health change); `done` ends the episode."""

    observation: Observation
    done: bool
    reward: float | None = None
    truncated: bool | None = None
    info: StepInfo = Field(default_factory=StepInfo)
    step_idx: int = 0


class Snapshot(_Answer):
    snapshot_id: str
    path: str = ""
    rl_run_id: str | None = None
    size: int = 0


# --- rollouts -----------------------------------------------------------------------------------


class RolloutStep(_Answer):
    obs: dict[str, Any] = Field(default_factory=dict)
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    reward: float | None = None
    done: bool = False
    truncated: bool | None = None
    info: dict[str, Any] | None = None
    logprob: float | None = None


class Trajectory(_Answer):
    env_id: str
    policy_id: str
    steps: list[RolloutStep]
    final: dict[str, Any] | None = None
    length: int = 0
    inference_url: str = ""
    decision_samples: list[dict[str, Any]] | None = None


class RolloutMetrics(_Answer):
    episode_returns: list[float] = Field(default_factory=list)
    mean_return: float = 0.0
    num_steps: int = 0
    num_episodes: int = 0
    outcome_score: float | None = None
    events_score: float | None = None
    details: dict[str, Any] = Field(default_factory=dict)


class RolloutResult(_Answer):
    """A finished rollout (the answer of `/rollout` and `/runs/{run_id}/result`)."""

    run_id: str
    trajectories: list[Trajectory]
    metrics: RolloutMetrics
    branches: dict[str, list[str]] = Field(default_factory=dict)
    aborted: bool = False
    ops_executed: int = 0
    trace_correlation_id: str = ""
    trace: dict[str, Any] | None = None
    pipeline_metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def achievements(self) -> list[str]:
        """Every achievement unlocked in the rollout."""
        return list(self.metrics.details.get("achievements", []))


class RunStatus(_Answer):
    """A run as the fleet sees it; `status` is queued, running, completed, aborted, failed or lost."""

    run_id: str
    status: str
    attempt: int = 0
    started_at: str | None = None
    finished_at: str | None = None
    progress: dict[str, Any] = Field(default_factory=dict)
    status_url: str = ""
    result_url: str = ""
    callback: dict[str, Any] | None = None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED


class SubmittedRun(_Answer):
    """One run of a submission; `accepted` false: the run_id was taken before (its run is reported)."""

    run_id: str
    status: str
    accepted: bool
    attempt: int = 0
    status_url: str = ""
    result_url: str = ""


class AbortResult(_Answer):
    ok: bool
    run_id: str
    status: str


# --- the task -----------------------------------------------------------------------------------


class TaskSplit(_Answer):
    """A split: `train` (ORS type "train") or the held-out `eval` ("test"), its seeds `[first, last]`
    and its task ids' template (`crafter/eval/{index}`, 0 <= index < num_tasks)."""

    name: str
    type: str | None = None
    num_tasks: int = 0
    seeds: list[int] = Field(default_factory=list)
    task_ids: str | None = None

    def task_id(self, index: int) -> str:
        if self.task_ids is None or not 0 <= index < self.num_tasks:
            raise ValueError(f"split {self.name!r} has no task {index}")
        return self.task_ids.format(index=index)


class TaskSet(_Answer):
    """The task set (`GET /task_info` without arguments): its splits, seed range and world config."""

    id: str
    name: str | None = None
    version: str | None = None
    splits: list[str] = Field(default_factory=list)
    default_split: str | None = None
    description: str | None = None
    seed_range: list[int] | None = None
    default_seed: int | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    task_id_format: str | None = None
    task_splits: list[TaskSplit] = Field(default_factory=list)

    def split(self, name: str) -> TaskSplit:
        for split in self.task_splits:
            if split.name == name:
                return split
        raise KeyError(f"no split {name!r}; this task set has {[split.name for split in self.task_splits]}")


class TaskInfo(_Answer):
    """One world (`GET /task_info?seed=N` or `?task_id=ID`): its dataset entry (seed, split, difficulty),
    limits, actions, traits."""

    task_id: str | None = None
    task: dict[str, Any] = Field(default_factory=dict)
    environment: str | None = None
    dataset: dict[str, Any] = Field(default_factory=dict)
    rubric: dict[str, Any] | None = None
    inference: dict[str, Any] = Field(default_factory=dict)
    limits: dict[str, Any] = Field(default_factory=dict)
    task_metadata: dict[str, Any] = Field(default_factory=dict)
    action_space: dict[str, Any] = Field(default_factory=dict)
    observation: dict[str, Any] = Field(default_factory=dict)

    @property
    def seed(self) -> int | None:
        seed = self.dataset.get("seed")
        return seed if isinstance(seed, int) else None

    @property
    def split(self) -> str | None:
        split = self.dataset.get("split")
        return split if isinstance(split, str) else None

    @property
    def actions(self) -> list[str]:
        return list(self.action_space.get("actions", []))


class AppInfo(_Answer):
    """`GET /info`: the service, dataset, rubrics, inference (the tool) and limits."""

    service: dict[str, Any] = Field(default_factory=dict)
    dataset: dict[str, Any] = Field(default_factory=dict)
    rubrics: dict[str, Any] = Field(default_factory=dict)
    inference: dict[str, Any] = Field(default_factory=dict)
    limits: dict[str, Any] = Field(default_factory=dict)
