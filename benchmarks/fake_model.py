"""A loopback OpenAI-compatible fake model for benchmarks, run as its own process.

    python -m benchmarks.fake_model [--latency 0.2] [--actions 1]     # prints {"port": N}, serves until SIGINT

Every POST answers with one `interact_many` tool call after `latency` seconds. The model name can
override both per request: `bench-a4-l200` means 4 actions per decision and a 200 ms latency.

The actions are a pure function of the crafter step the observation shows (`Step N/...`, the first
line of the user turn), so the floor measurement in `benchmarks.overhead` replays exactly the actions
the server executed (`bench_actions`). The server is a bare ASGI callable under uvicorn: answering
costs it well under a millisecond of its own CPU, which the benchmarks never count as the app's.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
import sys
from typing import Any

from .loopback import serve_on_loopback

# A walk that also hits what it faces: keeps the player moving, collecting and crafting a little.
ACTION_CYCLE = (
    "move_left",
    "do",
    "move_up",
    "do",
    "move_right",
    "do",
    "move_down",
    "do",
    "move_left",
    "move_left",
    "do",
    "move_up",
    "move_up",
    "do",
    "noop",
    "place_table",
)
_STEP = re.compile(rb"Step (\d+)/")
_MODEL = re.compile(rb'"model"\s*:\s*"bench-a(\d+)(?:-l(\d+))?"')
_ids = itertools.count(1)
_JSON_HEADERS = [(b"content-type", b"application/json")]


def bench_actions(step: int, count: int) -> list[str]:
    """The actions the fake model answers when the observation shows crafter step `step`."""
    return [ACTION_CYCLE[(step + offset) % len(ACTION_CYCLE)] for offset in range(count)]


def completion(actions: list[str], model: str) -> dict[str, Any]:
    call_id = next(_ids)
    call = {
        "id": f"call_{call_id}",
        "type": "function",
        "function": {"name": "interact_many", "arguments": json.dumps({"actions": actions})},
    }
    return {
        "id": f"chatcmpl-bench-{call_id}",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 1500, "completion_tokens": 20, "total_tokens": 1520},
    }


async def read_body(scope: dict[str, Any], receive: Any) -> bytes | None:
    """The whole body of an HTTP request, or None for any other scope (lifespan) or when the client went
    away first."""
    if scope["type"] != "http":
        return None
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


class FakeModelApp:
    """The ASGI app: `GET /health` and `POST <anything>` (a chat completion)."""

    def __init__(self, latency_s: float, actions: int) -> None:
        self.latency_s = latency_s
        self.actions = actions
        self.requests = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        raw = await read_body(scope, receive)
        if raw is None:
            return
        if scope["method"] == "GET":
            await _answer(send, {"ok": True, "requests": self.requests})
            return
        self.requests += 1
        body = raw
        step_match, model_match = _STEP.search(body), _MODEL.search(body)
        actions, latency, model = self.actions, self.latency_s, "bench"
        if model_match is not None:
            actions = int(model_match.group(1))
            model = model_match.group(0).split(b'"')[-2].decode()
            if model_match.group(2) is not None:
                latency = int(model_match.group(2)) / 1000
        if latency > 0:
            await asyncio.sleep(latency)
        step = int(step_match.group(1)) if step_match else 0
        await _answer(send, completion(bench_actions(step, actions), model))


async def _answer(send: Any, body: dict[str, Any]) -> None:
    payload = json.dumps(body).encode()
    headers = [*_JSON_HEADERS, (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="loopback fake model for the benchmarks")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each answer")
    parser.add_argument("--actions", type=int, default=1, help="actions per decision")
    args = parser.parse_args(argv)
    return serve_on_loopback(FakeModelApp(args.latency, args.actions), lifespan="off")


if __name__ == "__main__":
    sys.exit(main())
