"""The episode viewer: one self-contained HTML page per rollout (inline CSS, JS and PNG frames).

    RecordedRun ──replay(frame_size)──► Snapshots ──► positions (one per decision, plus one per episode
    end) ──► JSON in the page ──► a little script: slider, play/pause, step counter, panels

A position is either a decision (the frame the policy saw, its observation text, the model's message and
tool call, the actions executed, reward and unlocks) or an episode end (the frame after the last action:
the death, the truncation, or the end of the rollout). Frames are rendered at `FRAME_SIZE` px (16 px per
tile, crafter's own texture size) and shown at `DISPLAY_SIZE` px with pixelated scaling: the same picture
as a 288 px render at a quarter of the bytes (night frames are noisy and compress badly).

Nothing here touches the network or the file system; `viewer_cli.py`, `report.py` and `routes/view.py`
decide where the page goes. Every recorded string reaches the page as JSON data or escaped text, never
as markup.
"""

from __future__ import annotations

import base64
import html
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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
        return json.dumps(call, ensure_ascii=False)
    function: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else call
    name = function.get("name") or call.get("tool_name") or call.get("tool") or "?"
    arguments = function.get("arguments", call.get("args"))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return f"{name} {arguments}"
    return f"{name} {json.dumps(arguments, ensure_ascii=False)}"


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
        "rejected": [json.dumps(item, ensure_ascii=False) for item in decision.rejected],
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
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
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
        "__BASE_CSS__": BASE_CSS,
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
    return fill(_TEMPLATE, replacements)


def fill(template: str, replacements: dict[str, str]) -> str:
    """`template` with every marker replaced in one pass (inserted text is never scanned for markers)."""
    pattern = "|".join(re.escape(marker) for marker in replacements)
    return re.sub(pattern, lambda match: replacements[match.group(0)], template)


BASE_CSS = """
:root { --bg: #f6f7f9; --card: #fff; --ink: #1c2024; --muted: #6b7280; --line: #e2e5ea; --accent: #3e63dd; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif;
       background: var(--bg); color: var(--ink); }
header { padding: 14px 20px 8px; }
h1 { font-size: 18px; margin: 0 0 4px; word-break: break-all; }
h2 { font-size: 13px; text-transform: uppercase; letter-spacing: .04em; color: var(--muted); margin: 0 0 6px; }
.meta { color: var(--muted); }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 10px; padding: 12px; }
.muted { color: var(--muted); }
.status { margin: 8px 20px; padding: 8px 12px; border-radius: 8px; }
.status.ok { background: #e9f6ec; color: #18794e; }
.status.bad { background: #fdecec; color: #b4232a; }
.status pre { color: var(--ink); background: #fff; padding: 6px; border-radius: 6px; overflow: auto; }
pre { margin: 0; white-space: pre-wrap; word-break: break-word;
      font: 12px/1.35 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
a { color: var(--accent); }
"""

_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>__BASE_CSS__
main { display: grid; grid-template-columns: auto 1fr; gap: 16px; padding: 8px 20px 20px; align-items: start; }
#frame-box { width: calc(__DISPLAY__px + 26px); position: sticky; top: 8px; }
#frame, #noframe { width: __DISPLAY__px; height: __DISPLAY__px; border-radius: 4px; }
#frame { image-rendering: pixelated; display: block; background: #222; }
#noframe { display: none; align-items: center; justify-content: center; text-align: center; padding: 20px;
           background: #ddd; color: var(--muted); }
.controls { display: flex; gap: 6px; align-items: center; margin-top: 10px; }
.controls button { font: inherit; padding: 3px 10px; border: 1px solid var(--line); background: #fff;
                   border-radius: 6px; cursor: pointer; }
.controls button:hover { border-color: var(--accent); }
#slider { width: 100%; margin-top: 8px; }
#counter { font-weight: 600; margin-top: 6px; }
#kind { color: var(--muted); min-height: 2.9em; }
.panels { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 12px; }
.wide { grid-column: 1 / -1; }
#obs { max-height: 440px; overflow: auto; }
.kv { display: grid; grid-template-columns: max-content 1fr; gap: 4px 10px; margin: 0; }
.kv dt { color: var(--muted); }
.kv dd { margin: 0; word-break: break-word; }
.chip { display: inline-block; padding: 0 6px; margin: 1px; border-radius: 10px; font-size: 12px;
        background: #eef1fd; color: #2c46b5; }
.chip.new { background: #fff4d6; color: #8a5a00; font-weight: 600; }
#vitals .plot { fill: #fafbfc; stroke: var(--line); }
#vitals .reset { stroke: #9aa0a6; stroke-dasharray: 3 3; }
#vitals .unlock { fill: #f5a524; }
#vitals .legend { font-size: 11px; font-weight: 600; }
#vitals .axis { fill: var(--muted); font-weight: 400; }
#vitals .dot { fill: #f5a524; }
#vitals-cursor { stroke: var(--ink); stroke-width: 1.5; }
#timeline { margin: 0; padding-left: 22px; columns: 2; }
#timeline button { font: inherit; border: 0; background: none; color: var(--accent); cursor: pointer;
                   padding: 1px 0; text-align: left; }
@media (max-width: 900px) { main, .panels { grid-template-columns: 1fr; } #frame-box { position: static; } }
</style></head>
<body>
<header><h1>Episode viewer · __RUN_ID__</h1><div class="meta">__HEADER__</div></header>
<div id="status" class="status __STATUS_CLASS__">__STATUS__</div>
<main>
  <section class="card" id="frame-box">
    <img id="frame" alt="game frame"><div id="noframe">no frame: the replay did not reach this point</div>
    <div id="counter"></div><div id="kind"></div>
    <input id="slider" type="range" min="0" value="0" aria-label="position">
    <div class="controls">
      <button id="first" type="button" title="first">|◀</button>
      <button id="prev" type="button" title="previous (←)">◀</button>
      <button id="play" type="button" title="play / pause (space)">▶ play</button>
      <button id="next" type="button" title="next (→)">▶</button>
      <button id="last" type="button" title="last">▶|</button>
      <select id="speed" aria-label="speed"><option value="2">2/s</option><option value="5" selected>5/s</option>
        <option value="10">10/s</option><option value="25">25/s</option></select>
    </div>
  </section>
  <section class="panels">
    <div class="card"><h2>Observation</h2><pre id="obs"></pre></div>
    <div class="card">
      <h2 id="decision-title">Decision</h2>
      <dl class="kv">
        <dt>source</dt><dd id="source"></dd>
        <dt>message</dt><dd><pre id="message"></pre></dd>
        <dt>tool call</dt><dd><pre id="toolcall"></pre></dd>
        <dt>executed</dt><dd id="actions"></dd>
        <dt>rejected</dt><dd id="rejected"></dd>
        <dt>reward</dt><dd id="reward"></dd>
        <dt>unlocked</dt><dd id="unlocked"></dd>
        <dt>model call</dt><dd id="call"></dd>
        <dt>vitals</dt><dd id="vitals-now"></dd>
        <dt>achievements</dt><dd id="achievements"></dd>
      </dl>
    </div>
    <div class="card wide"><h2>Vitals over time</h2>__VITALS__</div>
    <div class="card wide"><h2>Achievement timeline</h2>__TIMELINE__</div>
  </section>
</main>
<script type="application/json" id="episode-data">__DATA__</script>
<script>
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("episode-data").textContent);
  var points = data.positions, frames = data.frames;
  var $ = function (id) { return document.getElementById(id); };
  var slider = $("slider"), frame = $("frame"), noframe = $("noframe"), cursor = $("vitals-cursor");
  var pos = 0, timer = null;
  slider.max = Math.max(points.length - 1, 0);
  function has(value) { return value !== null && value !== undefined && value !== ""; }
  function text(id, value) { $(id).textContent = has(value) ? String(value) : "–"; }
  function chips(id, names, cls) {
    var box = $(id);
    box.textContent = "";
    if (!names || !names.length) { box.textContent = "–"; return; }
    names.forEach(function (name) {
      var chip = document.createElement("span");
      chip.className = "chip" + (cls ? " " + cls : "");
      chip.textContent = name;
      box.appendChild(chip);
      box.appendChild(document.createTextNode(" "));
    });
  }
  function vitalsText(v) {
    return v ? "health " + v.health + ", food " + v.food + ", drink " + v.drink + ", energy " + v.energy : null;
  }
  function callText(p) {
    var parts = [];
    if (has(p.latency_ms)) { parts.push(Math.round(p.latency_ms) + " ms"); }
    if (has(p.tokens)) { parts.push(p.tokens); }
    return parts.join(" · ");
  }
  function showFrame(p) {
    if (has(p.frame)) {
      frame.src = "data:image/png;base64," + frames[p.frame];
      frame.style.display = "block";
      noframe.style.display = "none";
    } else {
      frame.removeAttribute("src");
      frame.style.display = "none";
      noframe.style.display = "flex";
    }
    frame.dataset.pos = String(pos);
  }
  function show(i) {
    if (!points.length) { text("counter", "no decisions recorded"); return; }
    pos = Math.max(0, Math.min(points.length - 1, i));
    var p = points[pos], d = p.kind === "decision";
    slider.value = pos;
    showFrame(p);
    text("counter", (d ? "Decision " : "After decision ") + p.decision + " · " + (pos + 1) + "/" + points.length);
    var where = "episode " + p.episode + (has(p.step) ? " · crafter step " + p.step : "");
    text("kind", where + (d ? "" : " · " + p.title));
    text("obs", p.obs);
    text("decision-title", d ? "Decision " + p.decision : p.title);
    text("source", d ? p.source + (p.model ? " (" + p.model + ")" : "") : null);
    text("message", d ? (p.error ? "[" + p.error + "] " : "") + (p.message || "") : null);
    text("toolcall", d ? p.tool_calls : null);
    chips("actions", d ? p.actions : null);
    chips("rejected", d ? p.rejected : null);
    text("reward", d ? p.reward : null);
    chips("unlocked", d ? p.unlocked : null, "new");
    text("call", d ? callText(p) : null);
    text("vitals-now", vitalsText(p.vitals));
    chips("achievements", p.achievements);
    if (cursor) {
      var x = __PAD__ + (__CHART_W__ - 2 * __PAD__) * pos / Math.max(points.length - 1, 1);
      cursor.setAttribute("x1", x);
      cursor.setAttribute("x2", x);
    }
  }
  function stop() {
    if (timer) { clearInterval(timer); timer = null; }
    $("play").textContent = "▶ play";
  }
  function play() {
    if (timer) { stop(); return; }
    if (pos >= points.length - 1) { show(0); }
    $("play").textContent = "pause";
    timer = setInterval(function () {
      if (pos >= points.length - 1) { stop(); } else { show(pos + 1); }
    }, 1000 / Number($("speed").value));
  }
  function go(target) { return function () { stop(); show(target()); }; }
  slider.addEventListener("input", go(function () { return Number(slider.value); }));
  $("first").addEventListener("click", go(function () { return 0; }));
  $("prev").addEventListener("click", go(function () { return pos - 1; }));
  $("next").addEventListener("click", go(function () { return pos + 1; }));
  $("last").addEventListener("click", go(function () { return points.length - 1; }));
  $("play").addEventListener("click", play);
  $("speed").addEventListener("change", function () { if (timer) { stop(); play(); } });
  document.querySelectorAll("#timeline button").forEach(function (button) {
    button.addEventListener("click", go(function () { return Number(button.dataset.pos); }));
  });
  document.addEventListener("keydown", function (e) {
    var tag = e.target && e.target.tagName;
    if (tag === "INPUT" || tag === "SELECT" || (tag === "BUTTON" && e.key === " ")) { return; }
    if (e.key === "ArrowRight") { stop(); show(pos + 1); e.preventDefault(); }
    else if (e.key === "ArrowLeft") { stop(); show(pos - 1); e.preventDefault(); }
    else if (e.key === " ") { play(); e.preventDefault(); }
  });
  show(0);
})();
</script>
</body></html>
"""
