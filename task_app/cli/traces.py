"""`task-app traces list | show | export`: read the trace database from the command line.

    task-app traces [--db PATH] list [--since 2h|7d|2025-01-31] [--min-achievements N] [--model M] [--limit N] [--json]
    task-app traces [--db PATH] show RUN_ID [--json] [--full]
    task-app traces [--db PATH] export --format jsonl|openai-sft|tokens [--episodes] [filters] -o FILE

`--db` is a database or a folder of them read as one (every container's file, `trace_db.py`), opened
read-only: the CLI never creates, migrates or writes a database, so it is safe to run against the file
a live server is writing.

Export formats, one line per LLM call:
- `jsonl`: the old system's SFT record (docs/compatibility.md, "SFT records"; `sft_records_from_trace`),
  every answered call; consumers filter on `metadata.usable` / `metadata.reward`.
- `openai-sft`: an OpenAI chat fine-tuning example `{"messages": [system, user, assistant + tool_calls],
  "tools": [interact_many], "parallel_tool_calls": false}`, only for usable answers that called
  `interact_many` with a JSON `actions` list. The store keeps image references, not image data, so image
  parts are dropped and the example keeps the text observation (the summary says how many).
- `tokens`: the exact tokens of each call (tracing/token_records.py); with `--episodes`, one line per
  episode instead: its token sequence, loss mask and logprobs (docs/episode-sequences.md).

Sessions are read one at a time while the file is written (a worker thread streams records into
`write_jsonl_atomic`), so exporting a large database needs memory for one session, not for all of them.

Exit codes: 0 done, 1 run not found, 2 bad arguments or a missing / unreadable database.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..core.json_codec import dumps, loads
from ..game import TOOL_NAME
from ..policy.prompts import tool_schema
from ..tracing import sft_records_from_trace, write_jsonl_atomic
from ..tracing.calls import IMAGE_REF
from ..tracing.token_records import episode_records_from_trace, token_records_from_trace
from .trace_db import DB_HELP, CliError, db_path, print_error, reading

EXIT_OK, EXIT_NOT_FOUND = 0, 1  # 2 is EXIT_USAGE (trace_db.py)
JSONL, OPENAI_SFT, TOKENS = "jsonl", "openai-sft", "tokens"
EXPORT_FORMATS = (JSONL, OPENAI_SFT, TOKENS)
DEFAULT_LIST_LIMIT = 50
ALL_ROWS = -1  # SQLite: a negative LIMIT means "no limit"
TEXT_PREVIEW_CHARS = 160  # `show` cuts the model's text here unless --full
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


# --- arguments -------------------------------------------------------------------------------------


def parse_since(text: str) -> datetime:
    """`30m`, `2h`, `7d`, `1w` (that long ago) or an ISO date/datetime (naive = UTC) → an aware datetime."""
    match = _DURATION.match(text)
    if match:
        amount, unit = float(match.group(1)), match.group(2).lower()
        return datetime.now(UTC) - timedelta(**{_UNITS[unit]: amount})
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a duration (30m, 2h, 7d, 1w) nor an ISO date (2025-01-31[T12:00])"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below {minimum}")
        return value

    return parse


def _add_filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", type=parse_since, default=None, help="created after: 2h, 7d, or an ISO date")
    parser.add_argument("--min-achievements", type=_at_least(0), default=None, metavar="N")
    parser.add_argument("--model", default=None, help="only sessions that called this model")


def add_traces_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register `traces` (list / show / export) on the CLI's subcommands; returns its parser."""
    traces = subparsers.add_parser("traces", help="list, show and export stored rollout traces")
    traces.add_argument("--db", type=Path, default=None, help=DB_HELP)
    # the same option after the sub-subcommand; SUPPRESS keeps it from overwriting the value given before it
    db_option = argparse.ArgumentParser(add_help=False)
    db_option.add_argument("--db", type=Path, default=argparse.SUPPRESS, help=DB_HELP)
    actions = traces.add_subparsers(dest="traces_command", required=True)

    listing = actions.add_parser("list", parents=[db_option], help="stored sessions, newest first")
    _add_filters(listing)
    listing.add_argument("--limit", type=_at_least(1), default=DEFAULT_LIST_LIMIT)
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(run=partial(_run, main=_list_command))

    show = actions.add_parser("show", parents=[db_option], help="one run, decision by decision")
    show.add_argument("run_id")
    show.add_argument("--json", action="store_true", help="print JSON instead of a table")
    show.add_argument("--full", action="store_true", help="do not shorten the model's text")
    show.set_defaults(run=partial(_run, main=_show_command))

    export = actions.add_parser("export", parents=[db_option], help="write training records (one per LLM call)")
    export.add_argument("--format", choices=EXPORT_FORMATS, default=JSONL)
    export.add_argument(
        "--episodes", action="store_true", help="with --format tokens: one line per episode (its token sequence)"
    )
    _add_filters(export)
    export.add_argument("-o", "--output", type=Path, required=True, help="JSONL file to write (replaced atomically)")
    export.set_defaults(run=partial(_run, main=_export_command))
    return traces


def _run(args: argparse.Namespace, main: Callable[[argparse.Namespace, Path], Awaitable[int]]) -> int:
    try:
        return anyio.run(main, args, db_path(args.db))
    except CliError as exc:
        return print_error(exc)


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")


# --- list ------------------------------------------------------------------------------------------


# (heading, no_wrap, right-aligned); short headings keep both tables readable in 80 columns
_SESSION_COLUMNS = (
    ("run_id", True, False),
    ("created (UTC)", True, False),
    ("model", False, False),
    ("seed", True, True),
    ("dec", True, True),
    ("ach", True, True),
    ("return", True, True),
    ("stop", True, False),
)
_SESSION_CAPTION = "dec = decisions, ach = achievements unlocked"
_DECISION_COLUMNS = (
    ("#", True, True),
    ("actions", False, False),
    ("unlocked", False, False),
    ("reward", True, True),
    ("ms", True, True),
    ("tokens", True, True),
    ("model text", False, False),
)
_DECISION_CAPTION = "ms = model latency, tokens = prompt→completion"


def _table(title: str, columns: tuple[tuple[str, bool, bool], ...], caption: str) -> Table:
    table = Table(title=title, caption=caption, title_justify="left", caption_justify="left", box=box.SIMPLE_HEAD)
    for heading, no_wrap, right in columns:
        table.add_column(heading, justify="right" if right else "left", no_wrap=no_wrap, overflow="fold")
    return table


def _when(value: Any) -> str:
    try:
        return datetime.fromisoformat(str(value)).astimezone(UTC).strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return str(value)


def _number(value: Any) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


async def _list_command(args: argparse.Namespace, db: Path) -> int:
    async with reading(db) as store:
        sessions = await store.list_sessions(args.since, args.min_achievements, args.model, args.limit)
    if args.json:
        _out(dumps(sessions))
        return EXIT_OK
    table = _table(f"Sessions in {db}", _SESSION_COLUMNS, _SESSION_CAPTION)
    for row in sessions:
        table.add_row(
            str(row["session_id"]),
            _when(row["created_at"]),
            str(row["model"] or row["policy_name"] or "-"),
            _number(row["seed"]),
            _number(row["num_timesteps"]),
            _number(row["achievements_count"]),
            _number(row["total_reward"]),
            str(row["stop_reason"] or "-"),
        )
    console = Console()
    console.print(table)
    limited = " (--limit reached)" if len(sessions) == args.limit else ""
    console.print(f"{len(sessions)} session(s){limited}", highlight=False)
    return EXIT_OK


# --- show ------------------------------------------------------------------------------------------


def decision_summary(step: Mapping[str, Any]) -> dict[str, Any]:
    """One stored decision (a session timestep) as the flat dict `show` prints."""
    events = step.get("events") or []
    lm = next((event for event in events if "call_records" in event), None)
    env: Mapping[str, Any] = next((event for event in events if "reward" in event), {})
    env_meta = env.get("metadata") or {}
    summary: dict[str, Any] = {
        "index": step["turn_number"] if step.get("turn_number") is not None else step.get("step_index"),
        "episode": (step.get("step_metadata") or {}).get("episode"),
        "actions": list(env_meta.get("actions") or []),
        "rejected": len(env_meta.get("rejected") or []),
        "unlocked": list(env_meta.get("achievements_added") or []),
        "reward": env.get("reward"),
        "source": "llm" if lm else "injected noop" if env_meta.get("injected_noop") else "scripted",
    }
    if lm is not None:
        call = (lm.get("call_records") or [{}])[0]
        summary.update(
            usable=bool((lm.get("metadata") or {}).get("usable")),
            model=lm.get("model_name"),
            latency_ms=lm.get("latency_ms"),
            input_tokens=lm.get("input_tokens"),
            output_tokens=lm.get("output_tokens"),
            text=call.get("output_text") or "",
            tool_calls=[spec.get("arguments_json") for spec in call.get("output_tool_calls") or []],
            error=(call.get("error") or {}).get("message"),
        )
    return summary


def session_summary(trace: Mapping[str, Any]) -> dict[str, Any]:
    """What `show` prints for one stored session: header, decisions, outcome."""
    meta = trace.get("metadata") or {}
    details = trace.get("session_metadata") or {}
    return {
        "run_id": trace.get("session_id"),
        "created_at": trace.get("created_at"),
        "policy": meta.get("policy_name"),
        "model": meta.get("model"),
        "seed": meta.get("seed"),
        "mode": meta.get("mode"),
        "decisions": [decision_summary(step) for step in trace.get("session_time_steps") or []],
        "outcome": {
            **(trace.get("outcome_reward") or {}),
            "achievements": list(meta.get("final_achievements") or []),
            "stop_reason": meta.get("stop_reason"),
            "aborted": meta.get("aborted"),
            "error": details.get("error"),
            "episodes": details.get("episodes") or [],
        },
    }


def _model_cell(decision: Mapping[str, Any], full: bool) -> str:
    if decision["source"] != "llm":
        return f"({decision['source']})"
    if decision.get("error"):
        text = f"error: {decision['error']}"
    else:
        text = decision.get("text") or ""
        if not decision.get("usable"):
            text = f"[unusable] {text}"
    if not full and len(text) > TEXT_PREVIEW_CHARS:
        text = text[: TEXT_PREVIEW_CHARS - 1] + "…"
    return text


def _tokens_cell(decision: Mapping[str, Any]) -> str:
    tokens = (decision.get("input_tokens"), decision.get("output_tokens"))
    return "-" if tokens == (None, None) else f"{_number(tokens[0])}→{_number(tokens[1])}"


def _print_session(summary: Mapping[str, Any], full: bool) -> None:
    console = Console()
    console.print(f"Run {summary['run_id']}, created {_when(summary['created_at'])} UTC", markup=False, highlight=False)
    console.print(
        f"policy {summary['policy']}, model {summary['model'] or '-'}, seed {summary['seed']}, mode {summary['mode']}",
        markup=False,
        highlight=False,
    )
    table = _table("Decisions", _DECISION_COLUMNS, _DECISION_CAPTION)
    for decision in summary["decisions"]:
        actions = " ".join(decision["actions"]) + (
            f" (+{decision['rejected']} rejected)" if decision["rejected"] else ""
        )
        table.add_row(
            _number(decision["index"]),
            actions,
            ", ".join(decision["unlocked"]) or "-",
            _number(decision["reward"]),
            _number(decision.get("latency_ms")),
            _tokens_cell(decision),
            _model_cell(decision, full),
        )
    console.print(table, markup=False)
    outcome = summary["outcome"]
    console.print(
        f"Outcome: return {_number(outcome.get('total_reward'))}, {_number(outcome.get('achievements_count'))} "
        f"achievement(s) ({', '.join(outcome['achievements']) or 'none'}), {_number(outcome.get('total_steps'))} "
        f"decision(s), stop: {outcome.get('stop_reason') or '-'}"
        + (f", error: {outcome['error']}" if outcome.get("error") else ""),
        markup=False,
        highlight=False,
    )


async def _show_command(args: argparse.Namespace, db: Path) -> int:
    async with reading(db) as store:
        trace = await store.get_session(args.run_id)
    if trace is None:
        raise CliError(f"no run {args.run_id!r} in {db}", EXIT_NOT_FOUND)
    summary = session_summary(trace)
    if args.json:
        _out(dumps(summary))
    else:
        _print_session(summary, args.full)
    return EXIT_OK


# --- export ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class ExportStats:
    sessions: int = 0
    records: int = 0
    skipped_unusable: int = 0  # openai-sft: the answer was not usable or did not call interact_many
    images_dropped: int = 0  # openai-sft: image parts the store does not keep
    without_tokens: int = 0  # tokens: answered calls recorded without exact tokens
    tokens_missing: int = 0  # tokens: records whose server sent no (or unusable) token data
    inconsistent_episodes: int = 0  # tokens --episodes: episodes whose turns do not extend each other


def _wire_tool_call(call: Mapping[str, Any], index: int) -> dict[str, Any]:
    """An OpenAI `tool_calls` entry with an id and JSON-string arguments, as fine-tuning expects."""
    function: Mapping[str, Any] = call["function"] if isinstance(call.get("function"), Mapping) else call
    arguments = function.get("arguments")
    return {
        "id": str(call.get("id") or f"call_{index}"),
        "type": "function",
        "function": {
            "name": str(function.get("name") or call.get("tool_name") or ""),
            "arguments": arguments if isinstance(arguments, str) else dumps(arguments or {}),
        },
    }


def _interact_many_calls(tool_calls: Any) -> list[dict[str, Any]] | None:
    """The answer's tool calls, or None unless every one is `interact_many` with a list of actions."""
    if not isinstance(tool_calls, list) or not tool_calls:
        return None
    calls = [_wire_tool_call(call, index) for index, call in enumerate(tool_calls) if isinstance(call, Mapping)]
    for call in calls:
        try:
            arguments = loads(call["function"]["arguments"])
        except ValueError:
            return None
        if call["function"]["name"] != TOOL_NAME or not isinstance(arguments, dict):
            return None
        if not isinstance(arguments.get("actions"), list) or not arguments["actions"]:
            return None
    return calls if len(calls) == len(tool_calls) else None


def _chat_message(entry: Mapping[str, Any], stats: ExportStats) -> dict[str, Any]:
    content = entry.get("content")
    if isinstance(content, list):
        kept = [part for part in content if not (isinstance(part, Mapping) and part.get("type") == IMAGE_REF)]
        stats.images_dropped += len(content) - len(kept)
        if all(isinstance(part, Mapping) and part.get("type") == "text" for part in kept):
            content = "\n".join(str(part.get("text", "")) for part in kept)
        else:
            content = kept
    message: dict[str, Any] = {"role": entry.get("role"), "content": content}
    if entry.get("tool_calls"):
        message["tool_calls"] = [_wire_tool_call(call, index) for index, call in enumerate(entry["tool_calls"])]
    for key in ("tool_call_id", "name"):
        if entry.get(key):
            message[key] = entry[key]
    return message


def openai_sft_example(record: Mapping[str, Any], stats: ExportStats) -> dict[str, Any] | None:
    """An SFT record (the old system's shape) as an OpenAI chat fine-tuning example, or None if it is not usable."""
    assistant = record.get("assistant") or {}
    calls = _interact_many_calls(assistant.get("tool_calls"))
    if not (record.get("metadata") or {}).get("usable") or calls is None:
        stats.skipped_unusable += 1
        return None
    answer: dict[str, Any] = {"role": "assistant", "tool_calls": calls}
    if assistant.get("content_text"):
        answer["content"] = assistant["content_text"]
    messages = [_chat_message(entry, stats) for entry in record.get("dialogue") or []]
    return {"messages": [*messages, answer], "tools": [tool_schema()], "parallel_tool_calls": False}


def export_records(
    trace: Mapping[str, Any], fmt: str, model: str | None, stats: ExportStats, *, episodes: bool = False
) -> Iterator[dict[str, Any]]:
    """The export lines of one stored session."""
    stats.sessions += 1
    if fmt == TOKENS and episodes:
        yield from _episode_lines(trace, model, stats)
        return
    if fmt == TOKENS:
        yield from _token_lines(trace, model, stats)
        return
    for record in sft_records_from_trace(trace):
        if model is not None and record.get("model") != model:
            continue
        line = record if fmt == JSONL else openai_sft_example(record, stats)
        if line is not None:
            stats.records += 1
            yield line


def _token_lines(trace: Mapping[str, Any], model: str | None, stats: ExportStats) -> Iterator[dict[str, Any]]:
    answered = sum(1 for record in sft_records_from_trace(trace) if model is None or record.get("model") == model)
    kept = 0
    for record in token_records_from_trace(trace):
        if model is not None and record.get("model") != model:
            continue
        kept += 1
        stats.records += 1
        stats.tokens_missing += bool(record.get("tokens_missing"))
        yield record
    stats.without_tokens += answered - kept


def _episode_lines(trace: Mapping[str, Any], model: str | None, stats: ExportStats) -> Iterator[dict[str, Any]]:
    for record in episode_records_from_trace(trace):
        if model is not None and record.get("model") != model:
            continue
        stats.records += 1
        stats.inconsistent_episodes += not record["prefix_consistent"]
        yield record


def _prepare_output(output: Path, databases: Sequence[Path]) -> None:
    if output.exists() and output.resolve() in {db.resolve() for db in databases}:
        raise CliError(f"refusing to overwrite the trace database {output} with the export")
    if output.is_dir():
        raise CliError(f"{output} is a directory; -o takes a file name")
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot create {output.parent}: {exc}") from exc


async def _export_command(args: argparse.Namespace, db: Path) -> int:
    output: Path = args.output
    if args.episodes and args.format != TOKENS:
        raise CliError("--episodes goes with --format tokens")
    stats = ExportStats()
    stderr = Console(stderr=True)
    async with reading(db) as store:
        await anyio.to_thread.run_sync(_prepare_output, output, store.paths)
        sessions = await store.list_sessions(args.since, args.min_achievements, args.model, ALL_ROWS)
        run_ids = [row["session_id"] for row in reversed(sessions)]  # oldest first
        progress = Progress(
            TextColumn("exporting sessions"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=stderr,
            transient=True,
            disable=not stderr.is_terminal,
        )
        task = progress.add_task("sessions", total=len(run_ids))

        def lines() -> Iterator[dict[str, Any]]:  # runs in the worker thread that writes the file
            for run_id in run_ids:
                trace = anyio.from_thread.run(store.get_session, run_id)
                if trace is not None:
                    yield from export_records(trace, args.format, args.model, stats, episodes=args.episodes)
                progress.advance(task)

        with progress:
            try:
                await anyio.to_thread.run_sync(write_jsonl_atomic, output.parent, output.name, lines())
            except OSError as exc:
                raise CliError(f"cannot write {output}: {exc}") from exc
    _export_report(stderr, output, args.format, stats)
    return EXIT_OK


def _export_report(console: Console, output: Path, fmt: str, stats: ExportStats) -> None:
    console.print(
        f"Wrote {stats.records} {fmt} record(s) from {stats.sessions} session(s) to {output}",
        markup=False,
        highlight=False,
    )
    if not stats.sessions:
        console.print("No session matched the filters; the file is empty.", style="yellow")
    if stats.skipped_unusable:
        console.print(f"Skipped {stats.skipped_unusable} call(s) without a usable interact_many answer.")
    if stats.without_tokens:
        console.print(
            f"Skipped {stats.without_tokens} call(s) recorded without exact tokens (ask with record.logprobs: true)."
        )
    if stats.tokens_missing:
        console.print(
            f"{stats.tokens_missing} record(s) say tokens_missing: true (their tokens_missing_reason says why).",
            style="yellow",
        )
    if stats.inconsistent_episodes:
        console.print(
            f"{stats.inconsistent_episodes} episode(s) say prefix_consistent: false (their divergence says where).",
            style="yellow",
        )
    if stats.images_dropped:
        console.print(
            f"Dropped {stats.images_dropped} image part(s): the trace store keeps image references, not images.",
            style="yellow",
        )
