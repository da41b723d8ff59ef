"""Serve the server suite's loopback fake model (tests/fake_model.py, on PYTHONPATH) from a child
process: prints `{"port": N}` and serves until its stdin closes. Run by the server's interpreter."""

from __future__ import annotations

import json
import sys

from fake_model import FakeModel, tool_call


def main() -> int:
    with FakeModel() as model:
        model.default = tool_call("move_left", "do")
        sys.stdout.write(json.dumps({"port": model.port}) + "\n")
        sys.stdout.flush()
        sys.stdin.read()  # until the parent closes the pipe
    return 0


if __name__ == "__main__":
    sys.exit(main())
