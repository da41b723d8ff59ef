"""What the agent doors (MCP at /mcp, the Open Reward Standard) share: tasks by split and id, episodes
started from them on env sessions, and the text and facts a step's result carries.

A task is a world: its split, its index in the split, and the seed it stands for; its id reads
`crafter/<split>/<index>`. The `train` split is every seed (index = seed).
"""

from __future__ import annotations

from typing import Any

from ..core.errors import BadRequest, InvalidRequest
from ..core.settings import Settings
from ..policy.prompts import turn_text
from ..sessions import EnvView, build_spec
from ..sessions.views import step_info
from .state import AppState

ENV_NAME = "crafter"


def splits(settings: Settings) -> list[dict[str, str]]:
    """The splits, as ORS names their kinds (`train`, `validation`, `test`)."""
    return [{"name": "train", "type": "train"}]


def num_tasks(settings: Settings, split: str) -> int:
    if split not in {entry["name"] for entry in splits(settings)}:
        names = [entry["name"] for entry in splits(settings)]
        raise BadRequest(f"unknown split; this server has {names}", code="unknown_split")
    return settings.max_seed + 1


def task(settings: Settings, split: str, index: int) -> dict[str, Any]:
    """The task at `index` of `split` (negative indices count from the end, as Python's)."""
    count = num_tasks(settings, split)
    if not -count <= index < count:
        raise BadRequest(f"index out of range: the {split} split has {count} tasks", code="task_index_out_of_range")
    index %= count
    return {"task_id": f"{ENV_NAME}/{split}/{index}", "split": split, "index": index, "seed": index}


def task_of_id(settings: Settings, task_id: str) -> dict[str, Any]:
    env_name, _, rest = task_id.partition("/")
    split, _, index = rest.partition("/")
    if env_name != ENV_NAME or not index.isdigit():
        raise InvalidRequest(
            f"task ids read {ENV_NAME}/<split>/<index>, e.g. {ENV_NAME}/train/7", code="invalid_task_id"
        )
    return task(settings, split, int(index))


def task_of_seed(settings: Settings, seed: int) -> dict[str, Any]:
    if not 0 <= seed <= settings.max_seed:
        raise InvalidRequest(f"seed must be in [0, {settings.max_seed}]", code="seed_out_of_range")
    return task(settings, "train", seed)


async def start(state: AppState, chosen: dict[str, Any]) -> EnvView:
    """A new env session on the task's world."""
    spec = build_spec(ENV_NAME, {}, int(chosen["seed"]), None, state.settings)
    return await state.sessions.envs.create(spec)


def step_facts(view: EnvView) -> dict[str, Any]:
    """What a step did and where the episode stands: reward, done, the achievements it unlocked, ..."""
    info = step_info(view)
    return {
        "reward": view.reward,
        "done": view.done,
        "truncated": view.truncated,
        "unlocks": info["achievements_added"],
        "actions": info["actions"],
        "rejected": info["rejected"],
        "step_idx": view.step_idx,
        "episode_over": view.episode_over,
    }


def result_text(view: EnvView, max_actions: int) -> str:
    """What the agent reads after a step: what ran, what it earned, then the observation."""
    facts = step_facts(view)
    lines = [f"Ran: {', '.join(facts['actions']) or 'nothing'}."]
    if facts["rejected"]:
        rejected = "; ".join(f"{item['item']} ({item['reason']})" for item in facts["rejected"])
        lines.append(f"Rejected: {rejected}.")
    if facts["unlocks"]:
        lines.append(f"Unlocked: {', '.join(facts['unlocks'])}.")
    lines.append(f"Reward: {view.reward:+g}.")
    if view.done:
        ending = "the time limit was reached" if view.truncated else "the player died"
        return "\n".join([*lines, f"The episode is over: {ending}.", "", view.observation.text])
    return turn_text(view.observation.text, max_actions, "\n".join(lines))
