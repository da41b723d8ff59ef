"""B8 density: how many rollouts one process carries at the model latencies trainers see.

    1024 rollouts in flight, 20 decisions each, a 2 s model, every rollout on a new seed

The same window as B3 (`benchmarks.concurrency`): share of the ideal (1024 / 2 s = 512 decisions/s),
event-loop lag inside the server, the server's RSS peak, failed rollouts, and the CPU of the load
generator and of the fake model, which must stay far from a core each so that what is measured is
the server. Run with 1 app process and with 2 (`task-app serve --processes N`), and with the
rollouts posted by a separate process with plain aiohttp (`benchmarks.rollout_driver`), as a
trainer's script would. Of the server's settings only the rollout cap is raised to the load, as a
user would: its pool of connections to the model follows the cap (docs/modal.md).
"""

from __future__ import annotations

from .concurrency import Phase, run_phase
from .report import Figure

BENCH = "B8"
ROLLOUTS = 1024
SETTINGS = {"max_concurrent_rollouts": ROLLOUTS + 64}


def run(repetitions: int, quick: bool) -> list[Figure]:
    rollouts = ROLLOUTS // 4 if quick else ROLLOUTS
    figures: list[Figure] = []
    for processes, separate in ((1, False), (1, True), (2, False)):
        phase = Phase(
            rollouts, 20, 2000, new_seeds=True, processes=processes, target_rss_mb=2048, separate_driver=separate
        )
        figures += run_phase(phase, repetitions, bench=BENCH, **SETTINGS)
    return figures
