"""Serve the server suite's loopback fake model (tests/fake_model.py, on PYTHONPATH) from a child
process: prints `{"port": N}` and serves until its stdin closes. Run by the server's interpreter.

    python fake_model_process.py          answers the tool call interact_many(move_left, do)
    python fake_model_process.py text     answers the text "... [move_left, do]", streamed when asked
"""

from __future__ import annotations

import json
import sys
from typing import Any

from fake_model import FakeModel, Recorded, chunk, sse, text, tool_call

TEXT_REPLY = "I will gather wood first. [move_left, do]"


def text_reply(record: Recorded) -> Any:
    """The text reply, as server-sent chunks when the request says `stream: true` (verifiers streams)."""
    body = record.body if isinstance(record.body, dict) else {}
    if body.get("stream"):
        return sse([chunk(TEXT_REPLY), chunk(finish_reason="stop")])
    return text(TEXT_REPLY)


def main() -> int:
    with FakeModel() as model:
        if sys.argv[1:] == ["text"]:
            model.responder = text_reply
        else:
            model.default = tool_call("move_left", "do")
        sys.stdout.write(json.dumps({"port": model.port}) + "\n")
        sys.stdout.flush()
        sys.stdin.read()  # until the parent closes the pipe
    return 0


if __name__ == "__main__":
    sys.exit(main())
