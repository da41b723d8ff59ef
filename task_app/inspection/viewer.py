"""The episode viewer: one self-contained HTML page per rollout (inline CSS, JS and PNG frames).

    RecordedRun ──replay(frame_size)──► Snapshots ──► positions (one per decision, plus one per episode
    end) ──► JSON in the page ──► a little script: slider, play/pause, step counter, panels

A position is either a decision (the frame the policy saw, its observation text, the model's message and
tool call, the actions executed, reward and unlocks) or an episode end (the frame after the last action:
the death, the truncation, or the end of the rollout). Frames are rendered at `FRAME_SIZE` px (16 px per
tile, crafter's own texture size) and shown at `DISPLAY_SIZE` px with pixelated scaling: the same picture
as a 288 px render at a quarter of the bytes (night frames are noisy and compress badly).

The page's markup, styles and script are package data (`templates/viewer.html`, `templates/base.css`),
filled in by marker. Nothing here touches the network or writes a file; `cli/view.py`, `report.py` and
`web/routes/view.py` decide where the page goes. Every recorded string reaches the page as JSON data or
escaped text, never as markup.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from ..core.json_codec import dumps, loads
from ..game import VITALS, WorldFactory
from ..tracing import safe_name
from .replay import RecordedDecision, RecordedRun, ReplayOutcome, Snapshot, replay

FRAME_SIZE = 144  # rendered px: 9 tiles of 16 px, crafter's texture resolution
DISPLAY_SIZE = 288  # shown px
CHART_WIDTH, CHART_HEIGHT, CHART_PAD = 640, 120, 18
MAX_VITAL = 9
VITAL_COLOURS = {"health": "#e5484d", "food": "#f5a524", "drink": "#3e8ed0", "energy": "#46a758"}
_VITALS_LINE = re.compile(rf"({'|'.join(VITALS)}) (\d+)/\d+")
_SAFE_NAME = re.compile(r"[A-Za-z0-9._-]{1,120}")
_ACHIEVEMENTS_LINE = re.compile(r"^Achievements \(\d+/\d+\): (.*)$", re.MULTILINE)


def page_name(run_id: str) -> str:
    """A file name for the run's page: the run id itself when it is a safe name, else a sanitised one."""
    if _SAFE_NAME.fullmatch(run_id) and not run_id.startswith("."):
        return f"{run_id}.html"
    return f"{safe_name(run_id)}.html"


@dataclass(frozen=True, slots=True)
class EpisodePage:
    html: str
    outcome: ReplayOutcome


def build_episode_page(run: RecordedRun, worlds: WorldFactory, frame_size: int = FRAME_SIZE) -> EpisodePage:
    """Replay `run` (rendering frames) and lay out its page. Blocking: CPU work for a worker thread."""
    outcome = replay(run, worlds, frame_size=frame_size)
    return EpisodePage(render_page(run, outcome), outcome)


# --- positions ------------------------------------------------------------------------------------


def _vitals_from_text(text: str | None) -> dict[str, int] | None:
    found = {name: int(value) for name, value in _VITALS_LINE.findall(text or "")}
    return found if len(found) == len(VITALS) else None


def _achievements_from_text(text: str | None) -> list[str]:
    match = _ACHIEVEMENTS_LINE.search(text or "")
    if not match or match.group(1) == "none":
        return []
    return [name.strip() for name in match.group(1).split(",")]


class _Frames:
    """Frames as base64 strings, each stored once."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self._index: dict[bytes, int] = {}

    def add(self, snapshot: Snapshot | None) -> int | None:
        if snapshot is None or snapshot.frame is None:
            return None
        if snapshot.frame not in self._index:
            self._index[snapshot.frame] = len(self.items)
            self.items.append(base64.b64encode(snapshot.frame).decode("ascii"))
        return self._index[snapshot.frame]


def _state(snapshot: Snapshot | None, text: str | None, frames: _Frames) -> dict[str, Any]:
    if snapshot is not None:
        return {
            "frame": frames.add(snapshot),
            "step": snapshot.step,
            "vitals": snapshot.vitals,
            "achievements": list(snapshot.achievements),
        }
    return {
        "frame": None,
        "step": None,
        "vitals": _vitals_from_text(text),
        "achievements": _achievements_from_text(text),
    }


def tool_call_text(call: Any) -> str:
    """`name {arguments}` for any tool-call shape the engine accepts (OpenAI, simplified, spec)."""
    if not isinstance(call, dict):
        return dumps(call, default=str)
    function: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else call
    name = function.get("name") or call.get("tool_name") or call.get("tool") or "?"
    arguments = function.get("arguments", call.get("args"))
    if isinstance(arguments, str):
        try:
            arguments = loads(arguments)
        except ValueError:
            return f"{name} {arguments}"
    return f"{name} {dumps(arguments, default=str)}"


def _decision_position(decision: RecordedDecision, snapshot: Snapshot | None, frames: _Frames) -> dict[str, Any]:
    tokens = None
    if decision.input_tokens is not None or decision.output_tokens is not None:
        tokens = f"{decision.input_tokens if decision.input_tokens is not None else '-'} in → " + (
            f"{decision.output_tokens if decision.output_tokens is not None else '-'} out"
        )
    return {
        "kind": "decision",
        "decision": decision.index,
        "episode": decision.episode,
        **_state(snapshot, decision.obs_before, frames),
        "obs": decision.obs_before or "(not recorded)",
        "source": decision.source,
        "model": decision.model,
        "message": decision.message,
        "error": decision.error,
        "tool_calls": "\n".join(tool_call_text(call) for call in decision.tool_calls) or None,
        "actions": list(decision.actions) if decision.actions is not None else None,
        "rejected": [dumps(item, default=str) for item in decision.rejected],
        "reward": decision.reward,
        "unlocked": list(decision.unlocked),
        "latency_ms": decision.latency_ms,
        "tokens": tokens,
    }


def _end_title(run: RecordedRun, decision: RecordedDecision, in_episode: int, last: bool) -> str:
    episode = f"Episode {decision.episode} over"
    if decision.terminated:
        return f"{episode}: the player died"
    limit = run.spec.max_steps_per_episode
    if decision.truncated and limit is not None and in_episode >= limit:
        return f"{episode}: the decision cap ({limit} per episode) was reached"
    if decision.truncated:
        return f"{episode}: its length ({run.spec.length} steps) ran out"
    return f"End of the rollout (stop reason: {run.info.get('stop_reason') or 'unknown'})" if last else episode


def positions(run: RecordedRun, outcome: ReplayOutcome, frames: _Frames) -> list[dict[str, Any]]:
    """One position per decision, plus one after each episode's last decision."""
    result: list[dict[str, Any]] = []
    decisions = run.decisions
    in_episode = 0
    for position, decision in enumerate(decisions):
        in_episode = 1 if position == 0 or decisions[position - 1].episode != decision.episode else in_episode + 1
        before = outcome.before[position] if position < len(outcome.before) else None
        result.append(_decision_position(decision, before, frames))
        last = position == len(decisions) - 1
        if last or decision.terminated or decision.truncated or decisions[position + 1].episode != decision.episode:
            after = outcome.after.get(decision.index)
            result.append(
                {
                    "kind": "end",
                    "decision": decision.index,
                    "episode": decision.episode,
                    **_state(after, decision.obs_after, frames),
                    "obs": decision.obs_after or "(not recorded)",
                    "title": _end_title(run, decision, in_episode, last),
                }
            )
    return result


# --- static parts ---------------------------------------------------------------------------------


def _status(run: RecordedRun, outcome: ReplayOutcome) -> tuple[str, str]:
    """(css class, inner HTML) of the replay banner."""
    spec = f" Replayed with {html.escape(run.spec.describe())}."
    if run.assumed:
        spec += f" Not in the record, so reconstructed: {html.escape(', '.join(run.assumed))}."
    if outcome.mismatch is not None:
        miss = outcome.mismatch
        diff = html.escape("\n".join(miss.diff()))
        return "bad", (
            f"Replay diverged at decision {miss.decision} (episode {miss.episode}) — {html.escape(miss.what)}."
            f" Frames stop there.{spec}<pre>{diff}</pre>"
        )
    if outcome.incomplete is not None:
        return "bad", f"Replay stopped: {html.escape(outcome.incomplete)}. Frames stop there.{spec}"
    return "ok", (
        f"Replay verified: all {outcome.checked} decisions in {outcome.episodes} episode(s) match the record.{spec}"
    )


def vitals_chart(points: Sequence[dict[str, Any]]) -> str:
    """An inline SVG of the four vitals over the positions, with episode boundaries and a cursor line."""
    count = max(len(points) - 1, 1)
    width, height, pad = CHART_WIDTH, CHART_HEIGHT, CHART_PAD

    def x(index: int) -> float:
        return round(pad + (width - 2 * pad) * index / count, 1)

    def y(value: int) -> float:
        return round(pad + (height - 2 * pad) * (MAX_VITAL - value) / MAX_VITAL, 1)

    parts = [
        f'<svg id="vitals" viewBox="0 0 {width} {height}" width="100%" role="img" aria-label="vitals over time">',
        f'<rect x="{pad}" y="{pad}" width="{width - 2 * pad}" height="{height - 2 * pad}" class="plot"/>',
    ]
    for index in range(1, len(points)):
        if points[index]["episode"] != points[index - 1]["episode"]:
            parts.append(f'<line class="reset" x1="{x(index)}" x2="{x(index)}" y1="{pad}" y2="{height - pad}"/>')
    for offset, name in enumerate(VITALS):
        coords = [f"{x(i)},{y(p['vitals'][name])}" for i, p in enumerate(points) if p.get("vitals")]
        colour = VITAL_COLOURS[name]
        if coords:
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.6" points="{" ".join(coords)}"/>')
        parts.append(f'<text x="{pad + offset * 70}" y="12" fill="{colour}" class="legend">{name}</text>')
    parts.append(f'<text x="{pad + 4 * 70}" y="12" class="legend axis"><tspan class="dot">●</tspan> unlock</text>')
    parts.append(f'<text x="{width - pad}" y="12" class="legend axis" text-anchor="end">0–{MAX_VITAL}</text>')
    for index, point in enumerate(points):
        if point.get("unlocked"):
            parts.append(f'<circle class="unlock" cx="{x(index)}" cy="{height - pad + 6}" r="3"/>')
    parts.append(f'<line id="vitals-cursor" x1="{x(0)}" x2="{x(0)}" y1="{pad - 4}" y2="{height - pad + 4}"/>')
    parts.append("</svg>")
    return "".join(parts)


def timeline(points: Sequence[dict[str, Any]]) -> str:
    items = [
        f'<li><button type="button" data-pos="{index}">decision {point["decision"]} · ep {point["episode"]}'
        f" · <b>{html.escape(name)}</b></button></li>"
        for index, point in enumerate(points)
        if point["kind"] == "decision"
        for name in point["unlocked"]
    ]
    return f'<ol id="timeline">{"".join(items)}</ol>' if items else '<p id="timeline" class="muted">none</p>'


def _json_for_script(value: Any) -> str:
    """JSON that cannot close its <script> element."""
    text = dumps(value)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _header(run: RecordedRun) -> str:
    info = run.info
    achievements = ", ".join(info.get("final_achievements") or []) or "none"
    fields = [
        ("seed", run.spec.seed),
        ("policy", info.get("policy_name") or "-"),
        ("model", info.get("model") or "no model"),
        ("decisions", len(run.decisions)),
        ("stop", info.get("stop_reason") or "-"),
        ("final achievements", achievements),
    ]
    return " · ".join(f"<span>{html.escape(name)}: <b>{html.escape(str(value))}</b></span>" for name, value in fields)


def render_page(run: RecordedRun, outcome: ReplayOutcome) -> str:
    """The whole HTML page for a replayed run."""
    frames = _Frames()
    points = positions(run, outcome, frames)
    status_class, status_html = _status(run, outcome)
    data = {"run_id": run.run_id, "frames": frames.items, "positions": points}
    replacements = {
        "__TITLE__": html.escape(f"Episode viewer · {run.run_id}"),
        "__BASE_CSS__": read_template("base.css"),
        "__RUN_ID__": html.escape(run.run_id),
        "__HEADER__": _header(run),
        "__STATUS_CLASS__": status_class,
        "__STATUS__": status_html,
        "__VITALS__": vitals_chart(points),
        "__TIMELINE__": timeline(points),
        "__DISPLAY__": str(DISPLAY_SIZE),
        "__PAD__": str(CHART_PAD),
        "__CHART_W__": str(CHART_WIDTH),
        "__DATA__": _json_for_script(data),
    }
    return fill(read_template("viewer.html"), replacements)


@cache
def read_template(name: str) -> str:
    """A file of `inspection/templates/` (package data: the pages' HTML, CSS and script), read once."""
    return (resources.files("task_app.inspection") / "templates" / name).read_text(encoding="utf-8")


def fill(template: str, replacements: dict[str, str]) -> str:
    """`template` with every marker replaced in one pass (inserted text is never scanned for markers)."""
    pattern = "|".join(re.escape(marker) for marker in replacements)
    return re.sub(pattern, lambda match: replacements[match.group(0)], template)
