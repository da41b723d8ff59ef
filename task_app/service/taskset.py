"""The task and dataset this app advertises (`/info`, `/task_info`), and per-task TaskInfo (the splits
and task ids are `core/tasks.py`'s)."""

from __future__ import annotations

import threading
from typing import Any

from ..core.lru import LruMap
from ..core.rubrics import Rubric
from ..core.settings import Settings
from ..core.tasks import Task, Tasks
from ..core.version import app_version
from ..game import ACTIONS, TOOL_NAME, WorldFactory, WorldTraits, world_traits
from ..policy.sampled_tokens import PROVIDER_TOKENS

TASK = {"id": "crafter_classic", "name": "Crafter Classic", "description": None, "version": "1.0.0"}
DATASET = {
    "id": "crafter_classic_procedural",
    "name": "Crafter Classic Procedural Seeds",
    "version": "1.0.0",
    "splits": ["train", "eval"],
    "default_split": "train",
    "cardinality": None,
    "description": "Procedural Crafter Classic seeds with reproducible world traits.",
}
PROXY_ENDPOINTS = {"openai": "/proxy/v1/chat/completions", "groq": "/proxy/groq/v1/chat/completions"}
OBSERVATION_KEYS = [
    "inventory",
    "achievements_status",
    "achievements_counts",
    "player_position",
    "player_direction",
    "semantic_map_patch7",
    "num_steps_taken",
    "max_steps_episode",
    "terminated",
    "truncated",
    "text",
]


def token_support() -> dict[str, Any]:
    """`/info`'s `inference.tokens`: the token data a rollout can return, how to ask, which providers give ids."""
    return {
        "per_decision": {"request": 'record.tokens: "decision" (or record.logprobs: true)', "where": "info.tokens"},
        "episode_sequences": {
            "request": 'record.tokens: "episode"',
            "where": "trajectories[].episode_sequences",
            "fields": ["input_ids", "loss_mask", "logprobs", "turns", "prefix_consistent", "divergence"],
            "history_reasoning": True,
        },
        "event_scores": {"where": "info.event_scores"},
        "providers": {name: dict(fields) for name, fields in PROVIDER_TOKENS.items()},
        "retokenized": False,
    }


class TraitsCache:
    """Bounded, thread-safe LRU of per-seed world traits (computing one generates the world)."""

    def __init__(self, worlds: WorldFactory, size: int) -> None:
        self._worlds = worlds
        self._items: LruMap[tuple[int, tuple[int, int], int], WorldTraits] = LruMap(size)
        self._lock = threading.Lock()

    def get(self, seed: int, area: tuple[int, int], length: int) -> WorldTraits:
        key = (seed, area, length)
        with self._lock:
            traits = self._items.get(key)
        if traits is None:
            traits = world_traits(self._worlds.world(seed, area, length))
            with self._lock:
                self._items.put(key, traits)
        return traits


class Taskset:
    """Everything `/info` and `/task_info` say, built once from settings and the rubrics."""

    def __init__(self, settings: Settings, rubrics: dict[str, Rubric]) -> None:
        self.settings = settings
        self.rubrics = rubrics
        self.tasks = Tasks(settings)

    def dataset(self) -> dict[str, Any]:
        return {
            **DATASET,
            "seed_range": [0, self.settings.max_seed],
            "default_seed": self.settings.default_seed,
            **self.tasks.describe(),
        }

    def inference(self) -> dict[str, Any]:
        return {
            "model": None,
            "inference_url": None,
            "supports_proxy": True,
            "endpoints": dict(PROXY_ENDPOINTS),
            "tool": {"name": TOOL_NAME, "parallel_tool_calls": False},
            "tokens": token_support(),  # under `inference`: /info's top-level keys are the old system's
        }

    def limits(self) -> dict[str, Any]:
        settings = self.settings
        return {
            "max_turns": settings.max_decisions,
            "max_response_tokens": None,
            "timeout_seconds": settings.max_time_s,
            "max_ops": 100_000,
            "max_time_s": int(settings.max_time_s),
            "max_actions_per_decision": settings.max_actions_per_decision,
            "max_concurrent_rollouts": settings.max_concurrent_rollouts,
            "max_seeds_per_task_info": settings.task_info_max_seeds,
        }

    def info(self) -> dict[str, Any]:
        return {
            "service": {"task": dict(TASK), "version": app_version()},
            "dataset": self.dataset(),
            "rubrics": {kind: rubric.model_dump() for kind, rubric in self.rubrics.items()},
            "inference": self.inference(),
            "limits": self.limits(),
        }

    def describe(self) -> dict[str, Any]:
        settings = self.settings
        return {
            "taskset": {
                **self.dataset(),
                "config": {"area": list(settings.area), "length": settings.episode_length},
            }
        }

    def _rubric_summary(self) -> dict[str, Any]:
        outcome = self.rubrics["outcome"]
        return {
            "outcome": None,
            "events": None,
            "version": outcome.version,
            "criteria_count": len(self.rubrics),
            "source": "rubrics",
            "aggregation": outcome.aggregation,
        }

    def task_info(self, task: Task, traits: WorldTraits) -> dict[str, Any]:
        settings, seed = self.settings, task.seed
        return {
            "task": dict(TASK),
            "task_id": task.task_id,
            "environment": "crafter",
            "dataset": {
                **self.dataset(),
                "split": task.split,
                "task_index": task.index,
                "seed": seed,
                "difficulty": traits.difficulty,
                "config": {"seed": seed, "area": list(settings.area), "length": settings.episode_length},
            },
            "rubric": self._rubric_summary(),
            "inference": self.inference(),
            "limits": self.limits(),
            "task_metadata": {},
            "action_space": {
                "type": "discrete",
                "description": f"Discrete action space with {len(ACTIONS)} actions including movement, "
                "crafting, and interaction",
                "size": len(ACTIONS),
                "actions": list(ACTIONS),
            },
            "observation": {
                "type": "dict",
                "description": "Text view for the model (9x7 local map, vitals, inventory, nearest resources) "
                "plus structured inventory, achievements and semantic map patch; RGB frame on request.",
                "summary": "Text view plus inventory, achievements and semantic map patch.",
                "keys": OBSERVATION_KEYS,
                "image_shape": [64, 64, 3],
                "seed": seed,
                "traits": traits.as_dict(),
                "inventory": traits.inventory,
                "player_position": list(traits.player_position),
            },
        }
