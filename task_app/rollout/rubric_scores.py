"""The two shipped rubrics (`rubrics/*.json`, advertised in `/info`) scored over a rollout, deterministically.

Each rubric criterion has a definition here over what the engine recorded (unlocks, inventories,
achievement counters, how the episode ended); docs/training-data.md, "Rubric scores", states them.

    episode ──► outcome criteria (one value each, over the whole episode)
            ──► event criteria (one value per decision, averaged over the episode's decisions)
    score = Σ value · weight / Σ weight over the criteria defined here (aggregation `weighted_sum`;
            `sum` adds the values; `custom` / `inherit` give no score)
    rollout = the mean over its episodes that made at least one decision

A criterion id of a rubric that this module does not define (a replaced rubric file) is listed as
`unscored` and left out of the score. The event rubric's own ranges cap some criteria below 1
(`milestone_setup` at 0.7, `inventory_depth` at 0.5, `execution_quality` at 0.1), so the best
possible events score of the shipped rubric is 0.775.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import TYPE_CHECKING, Any

import crafter.constants

from ..core.rubrics import Rubric
from ..game import ACHIEVEMENTS
from .scores import EVENTS, OUTCOME, EpisodeScores, RolloutScores, RubricScore

if TYPE_CHECKING:
    from .result import DecisionRecord, EpisodeSummary, RolloutResult

VITALS = ("health", "food", "drink", "energy")
VITAL_MAX = 9
# achievement_progression: tiers along the tech tree (the rubric: basic collection and placement
# least, wood and stone tools more, coal, iron, furnace and iron tools most, diamond highest).
TIERS: dict[str, int] = {
    **dict.fromkeys(
        ["collect_wood", "place_table", "collect_sapling", "collect_drink", "place_plant", "eat_cow", "wake_up"], 1
    ),
    **dict.fromkeys(["make_wood_pickaxe", "make_wood_sword", "eat_plant", "defeat_zombie"], 2),
    **dict.fromkeys(["collect_stone", "place_stone", "make_stone_pickaxe", "make_stone_sword", "defeat_skeleton"], 3),
    **dict.fromkeys(["collect_coal", "place_furnace", "collect_iron"], 4),
    **dict.fromkeys(["make_iron_pickaxe", "make_iron_sword"], 5),
    "collect_diamond": 6,
}
# resource_stockpile: what the next crafts need (a table takes 2 wood and a tool 1; a furnace 4 stone),
# wood weighted first.
STOCKPILE: dict[str, tuple[int, float]] = {"wood": (4, 0.4), "stone": (4, 0.3), "coal": (1, 0.15), "iron": (1, 0.15)}
PICKAXES = ("wood_pickaxe", "stone_pickaxe", "iron_pickaxe")
STATIONS = ("table", "furnace")
THREATS = ("zombie", "skeleton", "lava")
THREAT_RANGE = 3  # steps: a threat this close in the last observation before a death is its cause
LOW_VITAL = 5  # inventory_depth: food or drink raised from at most this is a buffer built in time
BUFFERS = ("wood", "stone", "sapling")
TOOLS = tuple(f"{kind}_{tool}" for kind in ("wood", "stone", "iron") for tool in ("pickaxe", "sword"))
_NEAREST_LINE = re.compile(r"^- (\w+): .*\((\d+) steps?\)$", re.M)

# The event rubric's ranges, as its descriptions give them.
UNLOCK, PROGRESS, REPEAT = 1.0, 0.4, 0.1
CRAFT_SETUP, PLACE_SETUP = 0.7, 0.5
VITAL_BUFFER, MATERIAL_BUFFER = 0.5, 0.3
CLEAN = 0.1


# --- how an episode ended -----------------------------------------------------------------------------


def ending(summary: EpisodeSummary, records: Sequence[DecisionRecord]) -> dict[str, str]:
    """`{"kind": "death" | "timeout" | "unfinished", "cause": ...}` from the recorded episode.

    death: a vital at 0 when health ran out (starvation, thirst, exhaustion), else the nearest threat
    within THREAT_RANGE steps in the last observation before it (zombie, skeleton, lava), else
    `unknown`. timeout (the episode's length or decision budget ran out): `idling` when at least half
    the decisions did nothing but noop, else `time_limit`. unfinished: the rollout stopped first.
    """
    if summary.terminated and records:
        last = records[-1]
        for vital, cause in (("food", "starvation"), ("drink", "thirst"), ("energy", "exhaustion")):
            if last.outcome.inventory_after.get(vital, 1) <= 0:
                return {"kind": "death", "cause": cause}
        near = [
            (int(steps), kind)
            for kind, steps in _NEAREST_LINE.findall(last.obs_text)
            if kind in THREATS and int(steps) <= THREAT_RANGE
        ]
        return {"kind": "death", "cause": min(near)[1] if near else "unknown"}
    if summary.truncated:
        idle = sum(1 for record in records if set(record.outcome.actions) <= {"noop"})
        return {"kind": "timeout", "cause": "idling" if records and 2 * idle >= len(records) else "time_limit"}
    return {"kind": "unfinished", "cause": "the rollout stopped before the episode ended"}


# --- outcome criteria (over an episode) ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EpisodeView:
    """What the outcome criteria read: the episode's unlocks, final inventory and ending."""

    unlocked: frozenset[str]
    inventory: Mapping[str, int]
    alive: bool
    ending: dict[str, str]


def achievement_progression(view: EpisodeView) -> float:
    return sum(TIERS.get(name, 1) for name in view.unlocked) / sum(TIERS.get(name, 1) for name in ACHIEVEMENTS)


def resource_stockpile(view: EpisodeView) -> float:
    return sum(weight * min(1.0, view.inventory.get(item, 0) / target) for item, (target, weight) in STOCKPILE.items())


def survival_state(view: EpisodeView) -> float:
    if not view.alive:
        return 0.0
    return fmean(min(VITAL_MAX, max(0, view.inventory.get(vital, 0))) / VITAL_MAX for vital in VITALS)


def failure_analysis(view: EpisodeView) -> float:
    return 0.0 if view.ending.get("cause") == "unknown" else 1.0


def _next_pickaxe_materials(inventory: Mapping[str, int]) -> float:
    """The share of the next pickaxe's materials held (1.0 once the iron pickaxe is in hand)."""
    for pickaxe in PICKAXES:
        if inventory.get(pickaxe, 0) < 1:
            uses: dict[str, int] = crafter.constants.make[pickaxe]["uses"]
            return sum(min(inventory.get(item, 0), need) for item, need in uses.items()) / sum(uses.values())
    return 1.0


def future_readiness(view: EpisodeView) -> float:
    tools = sum(1 for pickaxe in PICKAXES if view.inventory.get(pickaxe, 0) >= 1) / len(PICKAXES)
    stations = sum(1 for station in STATIONS if f"place_{station}" in view.unlocked) / len(STATIONS)
    return fmean((tools, stations, _next_pickaxe_materials(view.inventory)))


OUTCOME_CRITERIA: dict[str, Callable[[EpisodeView], float]] = {
    "achievement_progression": achievement_progression,
    "resource_stockpile": resource_stockpile,
    "survival_state": survival_state,
    "failure_analysis": failure_analysis,
    "future_readiness": future_readiness,
}


# --- event criteria (per decision) ---------------------------------------------------------------------


def _gained(record: DecisionRecord, items: Sequence[str]) -> bool:
    before, after = record.outcome.inventory_before, record.outcome.inventory_after
    return any(after.get(item, 0) > before.get(item, 0) for item in items)


def achievement_unlocks(record: DecisionRecord) -> float:
    outcome = record.outcome
    if outcome.unlocked:
        return UNLOCK
    if _gained(record, (*BUFFERS, "coal", "iron", "diamond", *TOOLS)):
        return PROGRESS
    after = outcome.counts_after
    if any(after.get(name, 0) > n for name, n in outcome.counts_before.items()):
        return REPEAT
    return 0.0


def _recipe(name: str) -> tuple[tuple[tuple[str, int], ...], tuple[str, ...]]:
    kind, _, item = name.partition("_")
    recipe = (crafter.constants.place if kind == "place" else crafter.constants.make)[item]
    return tuple(recipe["uses"].items()), tuple(f"place_{station}" for station in recipe.get("nearby", ()))


# place_* / make_* achievements: (materials used, the placements their stations take)
MILESTONES = {name: _recipe(name) for name in ACHIEVEMENTS if name.startswith(("place_", "make_"))}


def _affordable(name: str, inventory: Mapping[str, int], counts: Mapping[str, int]) -> bool:
    """A placement / craft whose materials (and, for a craft, placed stations) are all there."""
    uses, stations = MILESTONES[name]
    return all(inventory.get(item, 0) >= need for item, need in uses) and all(counts.get(s, 0) > 0 for s in stations)


def milestone_setup(record: DecisionRecord) -> float:
    outcome = record.outcome
    if outcome.inventory_after == outcome.inventory_before and outcome.counts_after == outcome.counts_before:
        return 0.0  # most decisions change nothing: kept by measurement (docs/decisions/trace-writer.md)
    ready = [
        name
        for name in MILESTONES
        if outcome.counts_after.get(name, 0) == 0
        and _affordable(name, outcome.inventory_after, outcome.counts_after)
        and not _affordable(name, outcome.inventory_before, outcome.counts_before)
    ]
    if any(name.startswith("make_") for name in ready):
        return CRAFT_SETUP
    return PLACE_SETUP if ready else 0.0


def inventory_depth(record: DecisionRecord) -> float:
    before, after = record.outcome.inventory_before, record.outcome.inventory_after
    if any(after.get(vital, 0) > before.get(vital, 0) <= LOW_VITAL for vital in ("food", "drink")):
        return VITAL_BUFFER
    return MATERIAL_BUFFER if _gained(record, BUFFERS) else 0.0


def execution_quality(record: DecisionRecord) -> float:
    outcome, plan = record.outcome, record.plan
    usable = record.decision is None or record.decision.usable
    hurt = outcome.inventory_after.get("health", 0) < outcome.inventory_before.get("health", 0)
    idle = set(outcome.actions) <= {"noop"}
    return CLEAN if usable and not plan.rejected and not plan.fallback_noop and not hurt and not idle else 0.0


EVENT_CRITERIA: dict[str, Callable[[DecisionRecord], float]] = {
    "achievement_unlocks": achievement_unlocks,
    "milestone_setup": milestone_setup,
    "inventory_depth": inventory_depth,
    "execution_quality": execution_quality,
}


# --- scores ---------------------------------------------------------------------------------------------


def aggregate(rubric: Rubric, values: Mapping[str, float]) -> RubricScore:
    """The rubric's score from the values of the criteria this module defines."""
    scored = [criterion for criterion in rubric.criteria if criterion.id in values]
    unscored = [criterion.id for criterion in rubric.criteria if criterion.id not in values]
    criteria = {criterion.id: values[criterion.id] for criterion in scored}
    score: float | None = None
    if scored and rubric.aggregation == "weighted_sum":
        score = sum(values[c.id] * c.weight for c in scored) / sum(c.weight for c in scored)
    elif scored and rubric.aggregation == "sum":
        score = sum(criteria.values())
    return RubricScore(score, criteria, unscored)


def episode_view(summary: EpisodeSummary, records: Sequence[DecisionRecord]) -> EpisodeView:
    inventory = records[-1].outcome.inventory_after if records else {}
    return EpisodeView(frozenset(summary.achievements), inventory, not summary.terminated, ending(summary, records))


def outcome_values(view: EpisodeView) -> dict[str, float]:
    return {name: criterion(view) for name, criterion in OUTCOME_CRITERIA.items()}


def decision_event_values(record: DecisionRecord) -> dict[str, float]:
    """Each event criterion's value for one decision."""
    return {name: criterion(record) for name, criterion in EVENT_CRITERIA.items()}


def decision_event_scores(record: DecisionRecord, rubric: Rubric) -> dict[str, Any]:
    """A decision's step `info.event_scores`: the event rubric over this decision alone. Its values are
    kept on the record (`event_values`), so the episode's means do not compute them again."""
    record.event_values = decision_event_values(record)
    return aggregate(rubric, record.event_values).as_dict(rubric.version)


def event_values(records: Sequence[DecisionRecord]) -> dict[str, float]:
    """Each event criterion's mean over the decisions."""
    values = [record.event_values or decision_event_values(record) for record in records]
    return {name: fmean(value[name] for value in values) for name in EVENT_CRITERIA}


def _mean_score(scores: Sequence[RubricScore], rubric: Rubric) -> RubricScore:
    if not scores:
        return RubricScore(None, {}, [criterion.id for criterion in rubric.criteria])
    names = scores[0].criteria
    criteria = {name: fmean(score.criteria[name] for score in scores) for name in names}
    values = [score.score for score in scores if score.score is not None]
    return RubricScore(fmean(values) if values else None, criteria, scores[0].unscored)


def score_rollout(result: RolloutResult, rubrics: Mapping[str, Rubric]) -> RolloutScores:
    """Both rubrics over every episode of `result` that made at least one decision."""
    by_episode: dict[int, list[DecisionRecord]] = {}
    for record in result.records:
        by_episode.setdefault(record.episode, []).append(record)
    episodes = []
    for summary in result.episodes:
        records = by_episode.get(summary.index, [])
        if not records:
            continue
        view = episode_view(summary, records)
        episodes.append(
            EpisodeScores(
                summary.index,
                view.ending,
                aggregate(rubrics[OUTCOME], outcome_values(view)),
                aggregate(rubrics[EVENTS], event_values(records)),
            )
        )
    return RolloutScores(
        outcome=_mean_score([episode.outcome for episode in episodes], rubrics[OUTCOME]),
        events=_mean_score([episode.events for episode in episodes], rubrics[EVENTS]),
        episodes=episodes,
        versions={kind: rubric.version for kind, rubric in rubrics.items()},
    )
