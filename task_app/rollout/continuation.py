"""Rollouts that continue from a state instead of a seed's new world (docs/rollouts.md, "Continuing").

    env.continue_from {env_id | snapshot_id} ─► (service) the state's checkpoint and what a rollout
        carried in it ─► RolloutStart ─► the engine plays on from that game
    record.snapshot ─► (engine) the last state as a checkpoint + `carried` ─► (service) a snapshot

`carried` is what the policy's next prompt needs beyond the game, so that a continued rollout asks
exactly what the uninterrupted one would have: the decisions so far (their count numbers the history
lines) and the summary history's last entries. A snapshot taken by the env-session routes carries
nothing: its rollout starts with an empty history.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.errors import InvalidRequest
from ..policy.base import HistoryEntry


@dataclass(frozen=True, slots=True)
class RolloutStart:
    """The state a rollout continues from."""

    checkpoint: bytes  # game.checkpoint.dump_game of the game
    decisions: int = 0  # decisions played before this state (carried)
    history: tuple[HistoryEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class RolloutEnd:
    """A rollout's last state, for `record.snapshot`."""

    checkpoint: bytes
    carried: dict[str, Any]


def carried(decisions: int, history: tuple[HistoryEntry, ...]) -> dict[str, Any]:
    entries = [
        {"i": e.decision_index, "a": list(e.actions), "u": list(e.achievements_added), "r": e.reward, "x": e.rejected}
        for e in history
    ]
    return {"decisions": decisions, "history": entries}


def start_of(checkpoint: bytes, carried_data: dict[str, Any]) -> RolloutStart:
    """The start a snapshot's checkpoint and carried data describe (data this app wrote; checked anyway)."""
    try:
        decisions = int(carried_data.get("decisions", 0))
        history = tuple(
            HistoryEntry(int(e["i"]), tuple(map(str, e["a"])), tuple(map(str, e["u"])), float(e["r"]), int(e["x"]))
            for e in carried_data.get("history", [])
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidRequest("the snapshot's rollout data is unreadable", code="invalid_snapshot") from exc
    return RolloutStart(checkpoint, decisions, history)
