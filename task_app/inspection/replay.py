"""Deterministic replay: rebuild a rollout's episodes from its seed, settings and executed actions.

    stored trace (SQLite) ─┐                      ┌─► every observation, reward, unlock and end flag
    rollout response ──────┴─► RecordedRun ─replay─┤   compared with the record → first Mismatch
                               (spec + decisions)  └─► Snapshots (frame, vitals) for the episode viewer

No image is stored anywhere: a world is a pure function of (seed, area, length) and crafter is
deterministic given the actions (`GameEnv` makes the few stock non-determinisms reproducible), so
replaying the executed actions of every decision reproduces the episode exactly. A new episode
(`on_done: reset`) is the same seed's fresh world; the per-episode decision cap truncates an episode
as the engine's `Game` does.

The spec comes from the trace's `metadata.replay` (written since tracing recorded it). For an older
trace, or a response without a structured trace, it is reconstructed: the length from the first
observation ("Step 0/10000"), `on_done` and the decision cap from the recorded episodes, the area from
the default setting; the names of those fields are listed in `RecordedRun.assumed`. A wrong guess cannot
go unnoticed: the very first observation (or the first truncation) would differ.
"""

from __future__ import annotations

import difflib
import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image

from ..core.json_codec import loads
from ..core.settings import Settings
from ..game import VITALS, ActionPlan, Game, WorldFactory

ENV_INSTANCE = "environment:crafter"
RESET, TERMINATE = "reset", "terminate"
PALETTE_COLOURS = 256
DIFF_LINES = 12  # a text mismatch shows at most this many diff lines
_STEP_LINE = re.compile(r"^Step \d+/(\d+)")


class ReplayError(Exception):
    """The record cannot be replayed at all (not a trace, no decisions); the message says what is missing."""


@dataclass(frozen=True, slots=True)
class ReplaySpec:
    seed: int
    area: tuple[int, int]
    length: int
    max_steps_per_episode: int | None
    on_done: str

    def describe(self) -> str:
        limit = "none" if self.max_steps_per_episode is None else str(self.max_steps_per_episode)
        return (
            f"seed {self.seed}, area {self.area[0]}x{self.area[1]}, length {self.length}, "
            f"decisions per episode {limit}, on_done {self.on_done}"
        )


@dataclass(frozen=True, slots=True)
class RecordedDecision:
    """One env op as recorded: what replay checks, plus what the viewer shows."""

    index: int
    episode: int
    actions: tuple[str, ...] | None  # executed, in order; None when the record lacks them
    reward: float
    unlocked: tuple[str, ...]
    terminated: bool | None
    truncated: bool | None
    obs_before: str | None
    obs_after: str | None
    source: str = "policy"  # "llm", "policy", or "injected noop"
    message: str | None = None  # the model's text (or a scripted policy's note)
    tool_calls: list[Any] = field(default_factory=list)
    rejected: list[Any] = field(default_factory=list)
    model: str | None = None
    latency_ms: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    error: str | None = None


@dataclass(slots=True)
class RecordedRun:
    run_id: str
    spec: ReplaySpec
    decisions: list[RecordedDecision]
    assumed: list[str] = field(default_factory=list)  # spec fields the record lacked
    info: dict[str, Any] = field(default_factory=dict)  # policy, model, stop_reason, ... for display


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The game at one observation, for the viewer."""

    step: int  # crafter steps into the episode
    vitals: dict[str, int]
    achievements: tuple[str, ...]
    frame: bytes | None


@dataclass(frozen=True, slots=True)
class Mismatch:
    decision: int
    episode: int
    what: str  # e.g. "reward", "observation after the decision"
    trace: Any
    replay: Any

    def diff(self, max_lines: int = DIFF_LINES) -> list[str]:
        """A short diff: unified for texts (trace → replay), both values otherwise."""
        if isinstance(self.trace, str) and isinstance(self.replay, str):
            lines = list(
                difflib.unified_diff(
                    self.trace.splitlines(), self.replay.splitlines(), "trace", "replay", n=0, lineterm=""
                )
            )
            return lines[:max_lines] + (
                [f"... ({len(lines) - max_lines} more lines)"] if len(lines) > max_lines else []
            )
        return [f"trace:  {self.trace!r}", f"replay: {self.replay!r}"]

    def as_dict(self) -> dict[str, Any]:
        return {"decision": self.decision, "episode": self.episode, "what": self.what, "diff": self.diff()}


@dataclass(slots=True)
class ReplayOutcome:
    run: RecordedRun
    checked: int = 0  # decisions replayed and found equal
    episodes: int = 0
    before: list[Snapshot] = field(default_factory=list)  # per replayed decision
    after: dict[int, Snapshot] = field(default_factory=dict)  # after episode-ending and the last decisions
    mismatch: Mismatch | None = None
    incomplete: str | None = None  # why replay had to stop without a verdict

    @property
    def ok(self) -> bool:
        return self.mismatch is None and self.incomplete is None and self.checked == len(self.run.decisions)


# --- replay ---------------------------------------------------------------------------------------


def encode_frame(frame: np.ndarray) -> bytes:
    """A frame as a 256-colour PNG: a third of the RGB size (night frames are noise), indistinguishable."""
    buffer = io.BytesIO()
    Image.fromarray(frame).quantize(PALETTE_COLOURS, method=Image.Quantize.FASTOCTREE).save(buffer, format="PNG")
    return buffer.getvalue()


def _snapshot(game: Game, frame_size: int | None) -> Snapshot:
    inventory = game.env.player.inventory
    frame = encode_frame(game.env.frame(frame_size)) if frame_size else None
    return Snapshot(
        game.env.step_count, {name: int(inventory[name]) for name in VITALS}, tuple(game.achievements()), frame
    )


def _new_game(spec: ReplaySpec, worlds: WorldFactory) -> Game:
    env = worlds.world(spec.seed, spec.area, spec.length)
    return Game(env, decision_limit=spec.max_steps_per_episode)


def _episode_problem(decision: RecordedDecision, game: Game | None, episode: int, spec: ReplaySpec) -> str | None:
    """Why the recorded episode index cannot follow the replayed game, if it cannot."""
    if game is None or decision.episode == episode:
        if game is not None and game.done:
            return "the replayed episode is over, but the trace continues it"
        return None
    if decision.episode != episode + 1:
        return f"the trace jumps from episode {episode} to {decision.episode}"
    if not game.done:
        return "the trace starts a new episode here, but the replayed episode is not over"
    if spec.on_done != RESET:
        return f"the trace starts a new episode although on_done is {spec.on_done!r}"
    return None


def _outcome_mismatch(
    decision: RecordedDecision, game: Game, executed: Sequence[str], reward: float, unlocked: Sequence[str], after: str
) -> Mismatch | None:
    recorded = decision.actions or ()
    checks: list[tuple[str, Any, Any]] = [
        ("number of executed actions (the episode ended at another step)", len(recorded), len(executed)),
        ("reward", decision.reward, reward),
        ("achievements unlocked", sorted(decision.unlocked), sorted(unlocked)),
    ]
    if decision.terminated is not None:
        checks.append(("terminated (the player died)", decision.terminated, game.terminated))
    if decision.truncated is not None:
        checks.append(("truncated", decision.truncated, game.truncated))
    if decision.obs_after is not None:
        checks.append(("observation after the decision", decision.obs_after, after))
    for what, recorded_value, replayed in checks:
        if recorded_value != replayed:
            return Mismatch(decision.index, decision.episode, what, recorded_value, replayed)
    return None


def replay(run: RecordedRun, worlds: WorldFactory, *, frame_size: int | None = None) -> ReplayOutcome:
    """Replay every decision of `run`; stop at the first difference. `frame_size` also renders frames."""
    outcome = ReplayOutcome(run)
    game: Game | None = None
    episode, observation_text = -1, ""
    for position, decision in enumerate(run.decisions):
        if decision.actions is None:
            outcome.incomplete = f"decision {decision.index} has no recorded actions (environment event metadata)"
            break
        problem = _episode_problem(decision, game, episode, run.spec)
        if problem is not None:
            outcome.mismatch = Mismatch(
                decision.index, decision.episode, f"episode: {problem}", decision.episode, episode
            )
            break
        if game is None or decision.episode != episode:
            game, episode = _new_game(run.spec, worlds), decision.episode
            observation_text = game.observe().text
            outcome.episodes += 1
        outcome.before.append(_snapshot(game, frame_size))
        if decision.obs_before is not None and decision.obs_before != observation_text:
            what = "observation before the decision"
            outcome.mismatch = Mismatch(decision.index, decision.episode, what, decision.obs_before, observation_text)
            break
        result, observation = game.step(ActionPlan(decision.actions))
        observation_text = observation.text
        if game.done or position == len(run.decisions) - 1:
            outcome.after[decision.index] = _snapshot(game, frame_size)
        mismatch = _outcome_mismatch(decision, game, result.actions, result.reward, result.unlocked, observation_text)
        if mismatch is not None:
            outcome.mismatch = mismatch
            break
        outcome.checked += 1
    return outcome


# --- records from a stored trace ------------------------------------------------------------------


def _as_int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _text(state: Any) -> str | None:
    return state.get("text") if isinstance(state, Mapping) and isinstance(state.get("text"), str) else None


def _assistant_tool_calls(step: Mapping[str, Any]) -> list[Any]:
    for message in step.get("markov_blanket_messages") or []:
        if (message.get("metadata") or {}).get("is_tool_call"):
            payload = (message.get("content") or {}).get("json_payload")
            try:
                calls = loads(payload).get("tool_calls") if isinstance(payload, str) else None
            except (ValueError, AttributeError):
                calls = None
            if isinstance(calls, list):
                return calls
    return []


def _decision_from_step(step: Mapping[str, Any], position: int) -> RecordedDecision:
    events: list[dict[str, Any]] = step.get("events") or []
    env: dict[str, Any] = next((e for e in events if e.get("system_instance_id") == ENV_INSTANCE or "reward" in e), {})
    lm = next((e for e in events if "call_records" in e), None)
    meta = env.get("metadata") or {}
    actions = meta.get("actions")
    index = _as_int(step.get("turn_number"))
    decision: dict[str, Any] = {
        "index": position if index is None else index,
        "episode": _as_int(meta.get("episode", (step.get("step_metadata") or {}).get("episode"))) or 0,
        "actions": tuple(str(a) for a in actions) if isinstance(actions, list) else None,
        "reward": float(env.get("reward") or 0.0),
        "unlocked": tuple(meta.get("achievements_added") or ()),
        "terminated": env.get("terminated"),
        "truncated": env.get("truncated"),
        "obs_before": _text(env.get("system_state_before")),
        "obs_after": _text(env.get("system_state_after")),
        "source": "injected noop" if meta.get("injected_noop") else "policy",
        "tool_calls": _assistant_tool_calls(step),
        "rejected": list(meta.get("rejected") or []),
    }
    if lm is not None:
        call = (lm.get("call_records") or [{}])[0]
        specs = call.get("output_tool_calls") or []
        decision.update(
            source="llm",
            message=call.get("output_text"),
            tool_calls=[
                {"name": s.get("name"), "arguments": s.get("arguments") or s.get("arguments_json")} for s in specs
            ]
            or decision["tool_calls"],
            model=lm.get("model_name"),
            latency_ms=lm.get("latency_ms"),
            input_tokens=lm.get("input_tokens"),
            output_tokens=lm.get("output_tokens"),
            error=(call.get("error") or {}).get("message"),
        )
    return RecordedDecision(**decision)


def _length_of(decisions: Sequence[RecordedDecision]) -> int | None:
    first = next((d.obs_before for d in decisions if d.obs_before), None)
    match = _STEP_LINE.match(first or "")
    return int(match.group(1)) if match else None


def _spec(
    seed: Any,
    stored: Any,
    episodes: Sequence[Mapping[str, Any]],
    decisions: Sequence[RecordedDecision],
    assumed: list[str],
) -> ReplaySpec:
    """The replay spec from `metadata.replay`, each missing field reconstructed and named in `assumed`."""
    stored = stored if isinstance(stored, Mapping) else {}
    if _as_int(seed) is None:
        raise ReplayError("the record has no seed (metadata.seed)")
    defaults = Settings.model_fields
    area = stored.get("area")
    if not (isinstance(area, list | tuple) and len(area) == 2):  # (width, height)
        area = defaults["area"].default
        assumed.append("area")
    length = _as_int(stored.get("length"))
    if length is None:
        length = _length_of(decisions) or int(defaults["episode_length"].default)
        assumed.append("length")
    on_done = stored.get("on_done")
    if on_done not in (RESET, TERMINATE):
        on_done = RESET if any(d.episode > 0 for d in decisions) else TERMINATE
        assumed.append("on_done")
    if "max_steps_per_episode" in stored:
        limit = _as_int(stored.get("max_steps_per_episode"))
    else:  # an episode truncated before its length ran out was cut by the decision cap
        cut = [
            _as_int(ep.get("decisions")) for ep in episodes if ep.get("truncated") and (ep.get("steps") or 0) < length
        ]
        limit = next((value for value in cut if value), None)
        assumed.append("max_steps_per_episode")
    return ReplaySpec(int(seed), (int(area[0]), int(area[1])), length, limit, on_done)


def run_from_trace(trace: Mapping[str, Any]) -> RecordedRun:
    """A stored (structured or full) SessionTrace as a RecordedRun."""
    if "session_time_steps" not in trace:
        raise ReplayError("not a session trace (no session_time_steps): use trace_format structured or full")
    meta = trace.get("metadata") or {}
    details = trace.get("session_metadata") or {}
    steps = sorted(trace["session_time_steps"], key=lambda step: _as_int(step.get("step_index")) or 0)
    decisions = [_decision_from_step(step, position) for position, step in enumerate(steps)]
    assumed: list[str] = []
    spec = _spec(meta.get("seed"), meta.get("replay"), details.get("episodes") or [], decisions, assumed)
    info = {key: meta.get(key) for key in ("policy_name", "model", "stop_reason", "final_achievements", "mode")}
    info.update(created_at=trace.get("created_at"), episodes=details.get("episodes") or [])
    return RecordedRun(str(trace.get("session_id")), spec, decisions, assumed, info)


# --- records from a rollout response --------------------------------------------------------------


def _decision_from_wire(step: Mapping[str, Any], position: int, after: str | None) -> RecordedDecision:
    info = step.get("info") or {}
    meta = info.get("meta") or {}
    actions = meta.get("actions")
    usage = meta.get("usage") or {}
    index = _as_int(meta.get("decision_index"))
    done, truncated = step.get("done"), step.get("truncated")
    return RecordedDecision(
        index=position if index is None else index,
        episode=_as_int(meta.get("episode")) or 0,
        actions=tuple(str(a) for a in actions) if isinstance(actions, list) else None,
        reward=float(step.get("reward") or 0.0),  # the wire sends null for no unlock
        unlocked=tuple(info.get("achievements_added") or ()),
        terminated=bool(done) and not truncated if isinstance(done, bool) else None,  # done = died or truncated
        truncated=truncated if isinstance(truncated, bool) else None,
        obs_before=_text(step.get("obs")),
        obs_after=after,
        source="injected noop" if meta.get("injected_noop") else "llm" if meta.get("model") else "policy",
        message=meta.get("goal") and f"goal: {meta['goal']}",
        tool_calls=list(step.get("tool_calls") or []),
        rejected=list(meta.get("rejected") or []),
        model=meta.get("model"),
        latency_ms=meta.get("latency_ms"),
        input_tokens=_as_int(usage.get("prompt_tokens", usage.get("input_tokens"))),
        output_tokens=_as_int(usage.get("completion_tokens", usage.get("output_tokens"))),
        error=meta.get("unusable_reason"),
    )


def run_from_response(response: Mapping[str, Any]) -> RecordedRun:
    """A RolloutResponse body as a RecordedRun: its structured `trace` when it has one, else its trajectory."""
    trace = response.get("trace")
    if isinstance(trace, Mapping) and "session_time_steps" in trace:
        return run_from_trace(trace)
    trajectories = response.get("trajectories") or []
    if not trajectories:
        raise ReplayError("the response has no trajectory")
    trajectory = trajectories[0]
    steps = list(trajectory.get("steps") or [])
    final = _text((trajectory.get("final") or {}).get("observation"))
    decisions = []
    for position, step in enumerate(steps):
        episode = ((step.get("info") or {}).get("meta") or {}).get("episode")
        if position + 1 < len(steps):
            following = steps[position + 1]
            same = ((following.get("info") or {}).get("meta") or {}).get("episode") == episode
            after = _text(following.get("obs")) if same else None  # a reset shows the next world, not this end
        else:
            after = final
        decisions.append(_decision_from_wire(step, position, after))
    details = (response.get("metrics") or {}).get("details") or {}
    pipeline = response.get("pipeline_metadata") or {}
    assumed: list[str] = []
    spec = _spec(pipeline.get("seed", details.get("seed")), None, details.get("episodes") or [], decisions, assumed)
    info = {
        "policy_name": pipeline.get("policy_name"),
        "model": next((d.model for d in decisions if d.model), None),
        "stop_reason": details.get("stop_reason"),
        "final_achievements": details.get("achievements") or [],
        "episodes": details.get("episodes") or [],
    }
    return RecordedRun(str(response.get("run_id")), spec, decisions, assumed, info)
