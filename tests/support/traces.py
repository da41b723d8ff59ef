"""Rollouts stored in and read back from real trace databases, and the commands that read them."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from task_app.cli.traces import add_traces_parser
from task_app.cli.view import add_viewer_parsers
from task_app.rollout.result import RolloutResult
from task_app.tracing import TraceReader, TraceStore
from task_app.tracing.rows import session_rows


async def store_result(store: TraceStore, result: RolloutResult) -> dict[str, Any]:
    """Write a finished rollout's rows to `store`, as the recorder does without live rows."""
    return await store.write(result.plan.run_id, session_rows(result))


def store_all(path: Path, *results: RolloutResult) -> Path:
    """A trace database at `path` holding these rollouts."""

    async def write() -> None:
        async with TraceStore(path) as trace_store:
            for result in results:
                assert (await store_result(trace_store, result)) == {"stored": True}

    asyncio.run(write())
    return path


def load_session(path: Path, run_id: str) -> dict[str, Any]:
    """The stored session of `run_id`, read through a reader."""

    async def read() -> dict[str, Any] | None:
        async with TraceReader(path) as reader:
            return await reader.get_session(run_id)

    trace = asyncio.run(read())
    assert trace is not None
    return trace


def run_cli(argv: Sequence[str | Path]) -> int:
    """`task-app traces | replay | view ...` in-process, through the real parsers; the exit code."""
    parser = argparse.ArgumentParser(prog="task-app")
    commands = parser.add_subparsers(dest="command", required=True)
    add_traces_parser(commands)
    add_viewer_parsers(commands)
    args = parser.parse_args([str(arg) for arg in argv])
    return int(args.run(args))
