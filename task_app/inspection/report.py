"""The evaluation report: one self-contained HTML page for `task-app eval` / `task-app demo`, plus an
episode viewer page per rollout next to it.

    rows (EpisodeRow, each with its RolloutResponse) ──► report.html
        success rate per achievement (bars), Crafter score with a bootstrap CI, achievements per episode,
        both rubric scores, model tokens and latency per decision, a table of episodes linking to
    ──► episodes/<run id>.html: the viewer, replayed from the response itself

The page's markup and styles are package data (`templates/report.html`, `templates/base.css`).

The episode pages are built from the rollout responses, not from a trace database: `eval` may talk to
a remote task app whose database is out of reach. A response that carries a structured trace
(`record.return_trace` with `trace_format: "structured"`, see `request_with_trace`) replays with the
exact recorded settings and shows the model's messages; without one, the trajectory steps are used and
the world size is taken as the default (the page says what was reconstructed, and replay verifies it).

The Crafter score's confidence interval resamples episodes with replacement (`BOOTSTRAP_RESAMPLES`
times, a `random.Random(BOOTSTRAP_SEED)`, so the same rows give the same interval) and takes the
central `CONFIDENCE` share of the resampled scores.
"""

from __future__ import annotations

import html
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..core.stats import percentile
from ..game import ACHIEVEMENTS, WorldFactory
from .replay import ReplayError, run_from_response
from .scoring import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    CONFIDENCE,
    EpisodeRow,
    bootstrap,
    crafter_score,
    mean_achievements,
    success_rates,
)
from .viewer import FRAME_SIZE, build_episode_page, fill, page_name, read_template

EPISODES_DIR = "episodes"
WORLD_CACHE = 64
HIST_WIDTH, HIST_HEIGHT, HIST_PAD = 520, 150, 22
_PERCENT = 100.0


def request_with_trace(request: dict[str, Any]) -> dict[str, Any]:
    """`request` asking for the structured trace in the response (the report's episode pages use it)."""
    record = {**request.get("record", {}), "return_trace": True, "trace_format": "structured"}
    return {**request, "record": record}


@dataclass(slots=True)
class ReportResult:
    path: Path
    pages: dict[str, Path] = field(default_factory=dict)  # run_id → its episode page
    replay_problems: dict[str, str] = field(default_factory=dict)  # run_id → what went wrong
    crafter_score: float = 0.0
    interval: tuple[float, float] = (0.0, 0.0)

    def describe(self) -> list[str]:
        """Lines for the console: where the report went and any episode whose replay went wrong."""
        lines = [
            f"Report: {self.path}"
            + (f" (+ {len(self.pages)} episode pages in {self.path.parent / EPISODES_DIR})" if self.pages else "")
        ]
        lines += [f"warning: episode {run_id}: {problem}" for run_id, problem in self.replay_problems.items()]
        return lines


def bootstrap_interval(
    episodes: Sequence[Sequence[str]],
    score: Callable[[Sequence[Sequence[str]]], float] = crafter_score,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    confidence: float = CONFIDENCE,
) -> tuple[float, float]:
    """Percentile bootstrap interval of `score` over episodes resampled with replacement."""
    return bootstrap(episodes, score, resamples=resamples, seed=seed, confidence=confidence)


# --- model calls ----------------------------------------------------------------------------------


def _steps(row: EpisodeRow) -> list[dict[str, Any]]:
    trajectories = (row.response or {}).get("trajectories") or []
    return list(trajectories[0].get("steps") or []) if trajectories else []


def call_samples(rows: Sequence[EpisodeRow]) -> dict[str, list[float]]:
    """Per decision that called a model: latency and tokens, from each step's `info.meta`."""
    samples: dict[str, list[float]] = {"latency ms": [], "prompt tokens": [], "completion tokens": []}
    for row in rows:
        for step in _steps(row):
            meta = (step.get("info") or {}).get("meta") or {}
            if not meta.get("model"):
                continue
            usage = meta.get("usage") or {}
            for key, value in (
                ("latency ms", meta.get("latency_ms")),
                ("prompt tokens", usage.get("prompt_tokens", usage.get("input_tokens"))),
                ("completion tokens", usage.get("completion_tokens", usage.get("output_tokens"))),
            ):
                if isinstance(value, int | float) and not isinstance(value, bool):
                    samples[key].append(float(value))
    return samples


def _calls_section(rows: Sequence[EpisodeRow]) -> str:
    samples = call_samples(rows)
    if not any(samples.values()):
        return '<p id="calls" class="muted">no model: every decision came from the scripted policy</p>'
    head = "".join(f"<th>{name}</th>" for name in ("per decision", "calls", "mean", "median", "p90", "max"))
    body = []
    for name, values in samples.items():
        if not values:
            body.append(f"<tr><td>{name}</td><td>0</td><td colspan=4 class=muted>not reported</td></tr>")
            continue
        cells = [statistics.fmean(values), statistics.median(values), percentile(values, 90), max(values)]
        body.append(
            f"<tr><td>{name}</td><td>{len(values)}</td>"
            + "".join(f"<td>{value:,.0f}</td>" for value in cells)
            + "</tr>"
        )
    return f'<table id="calls"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


# --- charts ---------------------------------------------------------------------------------------


def _rates_section(episodes: Sequence[Sequence[str]]) -> str:
    rates = success_rates(episodes)
    rows = []
    for name in sorted(ACHIEVEMENTS, key=lambda key: (-rates[key], key)):
        rate = rates[name]
        hits = sum(name in unlocked for unlocked in episodes)
        rows.append(
            f'<div class="rate"><span class="label">{name}</span>'
            f'<span class="track"><span class="rate-bar" data-achievement="{name}" data-rate="{rate:.1f}"'
            f' style="width: {rate:.1f}%"></span></span>'
            f'<span class="value">{rate:.0f}% <span class="muted">({hits}/{len(episodes)})</span></span></div>'
        )
    return f'<div id="rates">{"".join(rows)}</div>'


def _histogram(counts: Sequence[int]) -> str:
    """Episodes by number of achievements unlocked, as SVG columns."""
    top = max([*counts, 1])
    bins = [sum(1 for count in counts if count == value) for value in range(top + 1)]
    tallest = max([*bins, 1])
    width, height, pad = HIST_WIDTH, HIST_HEIGHT, HIST_PAD
    slot = (width - 2 * pad) / len(bins)
    parts = [f'<svg id="histogram" viewBox="0 0 {width} {height}" width="100%" role="img" aria-label="histogram">']
    for value, episodes in enumerate(bins):
        bar = (height - 2 * pad) * episodes / tallest
        x = pad + value * slot
        parts.append(
            f'<rect class="hist-bar" x="{x + 2:.1f}" y="{height - pad - bar:.1f}" width="{slot - 4:.1f}" '
            f'height="{bar:.1f}"><title>{episodes} episode(s) with {value} achievement(s)</title></rect>'
        )
        if episodes:
            parts.append(f'<text x="{x + slot / 2:.1f}" y="{height - pad - bar - 3:.1f}" class="n">{episodes}</text>')
        parts.append(f'<text x="{x + slot / 2:.1f}" y="{height - 6}" class="axis">{value}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _episode_bars(rows: Sequence[EpisodeRow], links: dict[str, str]) -> str:
    items = []
    for row in rows:
        width = _PERCENT * len(row.achievements) / len(ACHIEVEMENTS)
        label = f"seed {row.seed}"
        if row.run_id in links:
            label = f'<a class="episode-link" href="{html.escape(links[row.run_id])}">{label}</a>'
        value = "failed" if row.error else str(len(row.achievements))
        items.append(
            f'<div class="rate"><span class="label">{label}</span><span class="track">'
            f'<span class="episode-bar" style="width: {width:.1f}%"></span></span>'
            f'<span class="value">{value}</span></div>'
        )
    return f'<div id="per-episode">{"".join(items)}</div>'


# --- episodes -------------------------------------------------------------------------------------


def _episodes_table(rows: Sequence[EpisodeRow], links: dict[str, str], problems: dict[str, str]) -> str:
    head = "".join(
        f"<th>{name}</th>"
        for name in ("seed", "run", "achievements", "return", "decisions", "time (s)", "stop", "replay")
    )
    body = []
    for row in rows:
        run = html.escape(row.run_id)
        if row.run_id in links:
            run = f'<a class="episode-link" href="{html.escape(links[row.run_id])}">{run}</a>'
        if row.error:
            replay_cell = "-"
        elif row.run_id in problems:
            replay_cell = f'<span class="bad">{html.escape(problems[row.run_id])}</span>'
        else:
            replay_cell = '<span class="good">verified</span>'
        cells = [
            str(row.seed),
            run,
            f"{len(row.achievements)} <span class=muted>{html.escape(', '.join(row.achievements))}</span>",
            f"{row.episode_return:g}",
            str(row.decisions),
            f"{row.duration_s:.2f}",
            html.escape(row.error or row.stop_reason),
            replay_cell,
        ]
        body.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    return f'<table id="episodes"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _write_pages(
    rows: Sequence[EpisodeRow], directory: Path, worlds: WorldFactory, frame_size: int, result: ReportResult
) -> dict[str, str]:
    """Replay each answered rollout into its viewer page; returns run_id → link relative to the report."""
    links: dict[str, str] = {}
    for row in rows:
        if row.response is None:
            continue
        try:
            run = run_from_response(row.response)
        except ReplayError as exc:
            result.replay_problems[row.run_id] = f"no page: {exc}"
            continue
        page = build_episode_page(run, worlds, frame_size)
        target = directory / EPISODES_DIR / page_name(row.run_id)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(page.html, encoding="utf-8")
        result.pages[row.run_id] = target
        links[row.run_id] = f"{EPISODES_DIR}/{page_name(row.run_id)}"
        if page.outcome.mismatch is not None:
            miss = page.outcome.mismatch
            result.replay_problems[row.run_id] = f"diverged at decision {miss.decision} ({miss.what})"
        elif page.outcome.incomplete is not None:
            result.replay_problems[row.run_id] = page.outcome.incomplete
    return links


def _describe(rows: Sequence[EpisodeRow]) -> str:
    answered = [row for row in rows if row.response is not None]
    policies = sorted({str((row.response or {}).get("pipeline_metadata", {}).get("policy_name")) for row in answered})
    models = sorted(
        {
            str(meta["model"])
            for row in answered
            for step in _steps(row)
            if (meta := (step.get("info") or {}).get("meta") or {}).get("model")
        }
    )
    failed = len(rows) - sum(1 for row in rows if row.error is None)
    parts = [
        f"{len(rows)} episode(s)" + (f", {failed} failed" if failed else ""),
        f"policy {', '.join(policies) or '-'}",
        f"model {', '.join(models) or 'none (scripted)'}",
        f"generated {datetime.now(UTC).strftime('%Y-%m-%d %H:%M')} UTC",
    ]
    return " · ".join(html.escape(part) for part in parts)


def _rubric_card(rows: Sequence[EpisodeRow], kind: str) -> tuple[str, str, str]:
    """A summary card for one rubric score: its mean over the scored episodes."""
    values = [score for row in rows if row.error is None and (score := getattr(row, f"{kind}_score")) is not None]
    mean = f"{statistics.fmean(values):.3f}" if values else "-"
    return (f"{kind.capitalize()} score", mean, f"the {kind} rubric, mean of {len(values)} episode(s), in [0, 1]")


def write_report(
    rows: Sequence[EpisodeRow],
    path: Path,
    *,
    title: str = "Crafter evaluation",
    frame_size: int = FRAME_SIZE,
    worlds: WorldFactory | None = None,
    episode_pages: bool = True,
) -> ReportResult:
    """Write the report to `path` and (unless `episode_pages` is false) the viewer pages beside it.

    Blocking: replays every episode (about a second per 300 decisions). Scores count each rollout's
    first episode, as `evaluation.report` does; failed rollouts are listed but not scored.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    result = ReportResult(path)
    links: dict[str, str] = {}
    if episode_pages:
        links = _write_pages(rows, path.parent, worlds or WorldFactory(cache_size=WORLD_CACHE), frame_size, result)
    episodes = [row.achievements for row in rows if row.error is None]
    result.crafter_score = crafter_score(episodes)
    result.interval = bootstrap_interval(episodes)
    returns = [row.episode_return for row in rows if row.error is None]
    summary = [
        (
            "Crafter score",
            f"{result.crafter_score:.1f}",
            f"95% CI {result.interval[0]:.1f} – {result.interval[1]:.1f} "
            f"(bootstrap over episodes, {BOOTSTRAP_RESAMPLES} resamples)",
        ),
        (
            "Achievements per episode",
            f"{mean_achievements(episodes):.1f}",
            f"of {len(ACHIEVEMENTS)}; median {statistics.median([len(e) for e in episodes]) if episodes else 0:g}",
        ),
        ("Mean return", f"{statistics.fmean(returns) if returns else 0.0:.2f}", f"{len(episodes)} scored episode(s)"),
        *(_rubric_card(rows, kind) for kind in ("outcome", "events")),
    ]
    cards = "".join(
        f'<div class="card stat" id="stat-{index}"><div class="muted">{name}</div><div class="big">{value}</div>'
        f'<div class="muted small">{html.escape(note)}</div></div>'
        for index, (name, value, note) in enumerate(summary)
    )
    replacements = {
        "__TITLE__": html.escape(title),
        "__BASE_CSS__": read_template("base.css"),
        "__META__": _describe(rows),
        "__CARDS__": cards,
        "__RATES__": _rates_section(episodes),
        "__HISTOGRAM__": _histogram([len(e) for e in episodes]),
        "__PER_EPISODE__": _episode_bars(rows, links),
        "__CALLS__": _calls_section(rows),
        "__EPISODES__": _episodes_table(rows, links, result.replay_problems),
    }
    path.write_text(fill(read_template("report.html"), replacements), encoding="utf-8")
    return result
