"""The old system's answers (docs/compatibility.md, "Env-session routes"), built from an `EnvView`.

The observation is the one `/rollout` shows a policy: the structured dict of docs/contract.md ("The
environment"), plus the text the model reads under `text`, plus the frame (`observation_image_*`, the
old system's names) only when the env was created with `config.image_size`.
"""

from __future__ import annotations

from typing import Any

from .manager import EnvView, SnapshotInfo


def observation_body(view: EnvView) -> dict[str, Any]:
    observation = view.observation
    body = {**observation.data, "text": observation.text}
    if observation.image_png is not None:
        body["observation_image_base64"] = observation.image_base64
        body["observation_image_data_url"] = observation.image_data_url
    return body


def _env_info(view: EnvView) -> dict[str, Any]:
    return {"seed": view.seed, "task_id": view.task_id, "episode": view.episode, "done": view.done}


def created_body(view: EnvView) -> dict[str, Any]:
    """create, restore, `/CrafterClassic/initialize`: `{env_id, observation, info, step_idx}`."""
    return {
        "env_id": view.env_id,
        "observation": observation_body(view),
        "info": _env_info(view),
        "step_idx": view.step_idx,
    }


def reset_body(view: EnvView) -> dict[str, Any]:
    return {"observation": observation_body(view), "info": _env_info(view), "step_idx": view.step_idx}


def step_info(view: EnvView) -> dict[str, Any]:
    """What the call did: achievements it unlocked, actions run, what was rejected and why."""
    outcome, plan = view.outcome, view.plan
    info = _env_info(view)
    info.update(
        achievements_added=list(outcome.unlocked) if outcome else [],
        actions=outcome.actions if outcome else [],
        rejected=[rejection.as_dict() for rejection in plan.rejected] if plan else [],
        noop_fallback=bool(plan and plan.fallback_noop),
        terminated=view.done and not view.truncated,
        episode_over=view.episode_over,
    )
    return info


def step_body(view: EnvView) -> dict[str, Any]:
    """`{observation, done, info, reward, truncated, step_idx}`; `reward` is crafter's own."""
    return {
        "observation": observation_body(view),
        "done": view.done,
        "info": step_info(view),
        "reward": view.reward,
        "truncated": view.truncated,
        "step_idx": view.step_idx,
    }


def snapshot_body(snapshot: SnapshotInfo) -> dict[str, Any]:
    """`{snapshot_id, path, rl_run_id, size}`: `path` names the snapshot in the state store."""
    return {
        "snapshot_id": snapshot.snapshot_id,
        "path": f"state-store:{snapshot.key}",
        "rl_run_id": snapshot.rl_run_id,
        "size": snapshot.size,
    }
