"""`task-app replay RUN_ID` and `task-app view RUN_ID`: check and watch a stored rollout.

    task-app replay RUN_ID [--db PATH] [--json]
    task-app view RUN_ID [-o FILE.html] [--db PATH] [--frame-size PX]

Both read the run's trace from the trace database (opened read-only as `task-app traces` opens it,
`trace_db.py`) and rebuild its episodes from the seed, the recorded settings and the executed actions
(`inspection/replay.py`).

`replay` exit codes: 0 every observation, reward, unlock and end flag matches the trace; 1 the replay
diverged (the first differing decision is printed with a short diff); 2 the run cannot be replayed
(no such run, no database, a trace without recorded actions).

`view` writes one self-contained HTML page (default `./<run id>.html`). It exits 0 when the page was
written, also when the replay diverged: the page says where, and frames stop there (a warning is
printed); 2 when no page could be written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console

from ..core.json_codec import dumps
from ..game import WorldFactory
from ..inspection.replay import RecordedRun, ReplayError, ReplayOutcome, replay, run_from_trace
from ..inspection.viewer import FRAME_SIZE, build_episode_page, page_name
from .trace_db import DB_HELP, CliError, db_path, print_error, reading

EXIT_OK, EXIT_MISMATCH, EXIT_UNREPLAYABLE = 0, 1, 2  # a CliError exits 2 too
WORLD_CACHE = 4  # a run replays one seed: its world is generated once, restored for every reset
MIN_FRAME, MAX_FRAME = 16, 1024


def add_viewer_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `replay` and `view` on the CLI's subcommands."""
    check = subparsers.add_parser(
        "replay", help="rebuild a stored rollout from its seed and actions; check it against the trace"
    )
    check.add_argument("run_id")
    check.add_argument("--db", type=Path, default=None, help=DB_HELP)
    check.add_argument("--json", action="store_true", help="print the verdict as JSON")
    check.set_defaults(run=replay_command)

    view = subparsers.add_parser("view", help="write a self-contained HTML episode viewer for a stored rollout")
    view.add_argument("run_id")
    view.add_argument("-o", "--output", type=Path, default=None, help="HTML file (default ./<run id>.html)")
    view.add_argument("--db", type=Path, default=None, help=DB_HELP)
    view.add_argument(
        "--frame-size", type=int, default=FRAME_SIZE, help=f"rendered frame size in px (default {FRAME_SIZE})"
    )
    view.set_defaults(run=view_command)


# --- loading --------------------------------------------------------------------------------------


async def load_trace(db: Path, run_id: str) -> dict[str, Any]:
    """The stored session of `run_id`, read through a read-only store."""
    async with reading(db) as store:
        trace = await store.get_session(run_id)
    if trace is None:
        raise CliError(f"no run {run_id!r} in {db}")
    return trace


def _load_run(args: argparse.Namespace) -> RecordedRun:
    trace = anyio.run(load_trace, db_path(args.db), args.run_id)
    try:
        return run_from_trace(trace)
    except ReplayError as exc:
        raise CliError(f"run {args.run_id!r} cannot be replayed: {exc}") from exc


# --- replay ---------------------------------------------------------------------------------------


def verdict(outcome: ReplayOutcome) -> dict[str, Any]:
    """The replay's result as plain data (`--json`)."""
    run = outcome.run
    return {
        "run_id": run.run_id,
        "ok": outcome.ok,
        "decisions": len(run.decisions),
        "checked": outcome.checked,
        "episodes": outcome.episodes,
        "spec": {
            "seed": run.spec.seed,
            "area": list(run.spec.area),
            "length": run.spec.length,
            "max_steps_per_episode": run.spec.max_steps_per_episode,
            "on_done": run.spec.on_done,
        },
        "reconstructed": run.assumed,
        "mismatch": outcome.mismatch.as_dict() if outcome.mismatch else None,
        "incomplete": outcome.incomplete,
    }


def _print_verdict(outcome: ReplayOutcome) -> None:
    run, console = outcome.run, Console(highlight=False)
    console.print(f"Run {run.run_id}: {run.spec.describe()}", markup=False, soft_wrap=True)
    if run.assumed:
        console.print(
            f"Not in the trace, reconstructed: {', '.join(run.assumed)}", style="yellow", markup=False, soft_wrap=True
        )
    if outcome.mismatch is not None:
        miss = outcome.mismatch
        console.print(
            f"MISMATCH at decision {miss.decision} (episode {miss.episode}): {miss.what} "
            f"({outcome.checked} decision(s) matched before it)",
            style="red",
            markup=False,
            soft_wrap=True,
        )
        for line in miss.diff():
            console.print(f"  {line}", markup=False, soft_wrap=True)
    elif outcome.incomplete is not None:
        console.print(f"cannot replay: {outcome.incomplete}", style="red", markup=False, soft_wrap=True)
    else:
        console.print(
            f"OK: {outcome.checked} decision(s) in {outcome.episodes} episode(s); every observation, reward, "
            "unlock and end flag matches the trace",
            style="green",
            markup=False,
            soft_wrap=True,
        )


def replay_command(args: argparse.Namespace) -> int:
    try:
        run = _load_run(args)
    except CliError as exc:
        return print_error(exc)
    outcome = replay(run, WorldFactory(cache_size=WORLD_CACHE))
    if args.json:
        sys.stdout.write(dumps(verdict(outcome), pretty=True) + "\n")
    else:
        _print_verdict(outcome)
    if outcome.mismatch is not None:
        return EXIT_MISMATCH
    return EXIT_OK if outcome.ok else EXIT_UNREPLAYABLE


# --- view -----------------------------------------------------------------------------------------


def view_command(args: argparse.Namespace) -> int:
    console = Console(stderr=True, highlight=False)
    if not MIN_FRAME <= args.frame_size <= MAX_FRAME:
        return print_error(CliError(f"--frame-size must be in [{MIN_FRAME}, {MAX_FRAME}]"))
    try:
        run = _load_run(args)
    except CliError as exc:
        return print_error(exc)
    page = build_episode_page(run, WorldFactory(cache_size=WORLD_CACHE), frame_size=args.frame_size)
    output: Path = args.output or Path(page_name(run.run_id))
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(page.html, encoding="utf-8")
    except OSError as exc:
        return print_error(CliError(f"cannot write {output}: {exc}"))
    outcome = page.outcome
    if outcome.mismatch is not None:
        miss = outcome.mismatch
        console.print(
            f"warning: the replay diverged at decision {miss.decision} ({miss.what}); frames stop there",
            style="yellow",
            markup=False,
            soft_wrap=True,
        )
    elif outcome.incomplete is not None:
        console.print(f"warning: {outcome.incomplete}; frames stop there", style="yellow", markup=False, soft_wrap=True)
    console.print(
        f"Wrote {output} ({len(run.decisions)} decisions, {len(page.html) // 1024} KiB)", markup=False, soft_wrap=True
    )
    return EXIT_OK
