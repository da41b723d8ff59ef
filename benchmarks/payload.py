"""B5 payload: what a 50-decision rollout costs in bytes, on the wire and in the trace store.

    response   body bytes of POST /rollout per `record.trace_format` (none = `return_trace: false`,
               compact, structured, full), as sent with `Accept-Encoding: identity` and with gzip
               (the app's GZipMiddleware compresses bodies over 1 KB when the client accepts it)
    stored     SQLite bytes per stored rollout: the database file after the server closed it (WAL
               checkpointed) minus the empty database, over the number of rollouts stored

Zero model latency, 1 action per decision. Sizes barely vary between repetitions (timestamps and
ids); the report still gives the median.
"""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

import anyio

from .client import client, post_rollout, rollout_body
from .processes import app_server, fake_model
from .report import Figure

BENCH = "B5"
DECISIONS = 50
FORMATS = (None, "compact", "structured", "full")
STORED_ROLLOUTS = 5


async def _sizes(app_url: str, model_url: str, seed: int) -> dict[tuple[str, bool], int]:
    sizes = {}
    for gzip in (False, True):
        async with client(2, gzip=gzip) as http:
            for trace_format in FORMATS:
                body = rollout_body(model_url, seed, DECISIONS, trace_format=trace_format)
                outcome = await post_rollout(http, app_url, body)
                sizes[(trace_format or "none", gzip)] = outcome.wire_bytes
    return sizes


def _database_bytes(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
        (page_size,) = conn.execute("PRAGMA page_size").fetchone()
    return int(pages) * int(page_size)


def stored_bytes_per_rollout(model_url: str, seed: int) -> float:
    """Bytes one 50-decision rollout adds to a fresh trace database."""
    with tempfile.TemporaryDirectory(prefix="bench-store-") as directory:
        empty_dir, full_dir = Path(directory) / "empty", Path(directory) / "full"
        with app_server(traces_dir=empty_dir):
            pass
        with app_server(traces_dir=full_dir) as app:
            bodies = [rollout_body(model_url, seed, DECISIONS) for _ in range(STORED_ROLLOUTS)]

            async def run() -> None:
                async with client(2) as http:
                    for body in bodies:
                        await post_rollout(http, app.url, body)

            anyio.run(run)
        grown = _database_bytes(full_dir / "traces.db") - _database_bytes(empty_dir / "traces.db")
    return grown / STORED_ROLLOUTS


def run(repetitions: int, quick: bool) -> list[Figure]:
    seed = 9000
    figures = {
        (name or "none", gzip): Figure(
            BENCH,
            f"response_kb_{name or 'none'}{'_gzip' if gzip else ''}",
            f"response, trace {name or 'none'}{', gzip' if gzip else ''}",
            "KB",
            digits=1,
        )
        for gzip in (False, True)
        for name in FORMATS
    }
    stored = Figure(BENCH, "stored_kb_per_rollout", "SQLite per stored rollout (tracing on)", "KB", digits=1)
    with fake_model() as model:
        with app_server() as app:
            anyio.run(_sizes, app.url, model.url, seed)  # warm up (and the world cache)
            for _ in range(repetitions):
                for key, size in anyio.run(_sizes, app.url, model.url, seed).items():
                    figures[key].values.append(size / 1000)
        stored.values.append(stored_bytes_per_rollout(model.url, seed) / 1000)
    return [*figures.values(), stored]
