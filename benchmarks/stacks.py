"""Sum py-spy's collapsed stacks (`python -m benchmarks --profile DIR --profile-format raw`) per function.

    python -m benchmarks.stacks DIR/app_server-01.txt [--top 40] [--under NAME]

Prints each function's share of the samples: inclusive (the function or anything it called was on
the stack; counted once per sample even when it recurses) and self (it was the innermost frame).
`--under NAME` keeps only the samples whose stack holds a function whose name contains NAME.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"^(?P<name>.*?) \((?P<where>[^()]*)\)$")


def _function(frame: str) -> str:
    """`name (path/to/module.py:123)` -> `name (module.py)`: lines of one function fold together."""
    match = _FRAME.match(frame.strip())
    if match is None:
        return frame.strip()
    where = match["where"].rsplit(":", 1)[0]
    return f"{match['name']} ({Path(where).name})"


def summarise(path: Path, under: str | None = None) -> tuple[int, Counter[str], Counter[str]]:
    """(samples, inclusive counts, self counts) of one collapsed-stack file."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = [_function(frame) for frame in stack.split(";")[1:]]  # the first is the thread
        if under is not None and not any(under in frame for frame in frames):
            continue
        count = int(count_text)
        total += count
        for frame in set(frames):
            inclusive[frame] += count
        if frames:
            own[frames[-1]] += count
    return total, inclusive, own


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stacks", description=__doc__)
    parser.add_argument("path", type=Path)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--under", default=None, help="only samples with a frame whose name contains this")
    args = parser.parse_args(argv)
    total, inclusive, own = summarise(args.path, args.under)
    if not total:
        print("no samples")
        return 1
    print(f"{total} samples")
    for title, counts in (("inclusive", inclusive), ("self", own)):
        print(f"\n{title}:")
        for name, count in counts.most_common(args.top):
            print(f"{100 * count / total:6.1f} %  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
