"""CPU of the server's per-decision model POST, by HTTP client stack, in this process.

    python -m benchmarks.outbound_calls --stack outbound|aiohttp|httpx --calls N [--url URL]

Sends `N` sequential POSTs of a model request (the size of a `crafter-react` decision's) to a loopback
fake model (`benchmarks.fake_model`, started here unless `--url` names one) through one stack:

    outbound   the app's own `task_app.core.outbound.post` (what a rollout's decision uses)
    aiohttp    one pooled `aiohttp.ClientSession`, as `outbound` would use it (no cookies, no redirects)
    httpx      one pooled `httpx.AsyncClient`, the same

and prints the process's CPU seconds for the calls. Timings on a shared machine are noisy; instruction
counts are not: under callgrind, the calls alone are counted (between the `getppid` and `getuid`
this module makes around them; docs/decisions/http-client.md has the figures):

    valgrind --tool=callgrind --zero-before=getppid --dump-before=getuid --callgrind-out-file=cg.%p \\
        python -m benchmarks.outbound_calls --stack aiohttp --calls 500 --url http://127.0.0.1:PORT
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable

import aiohttp
import httpx

from task_app.core import outbound

from .processes import fake_model

CONNECT_S, READ_S, TOTAL_S, MAX_BYTES = 10.0, 120.0, 130.0, 8 * 1024 * 1024
HEADERS = {"Accept": "application/json", "Authorization": "Bearer bench", "Content-Type": "application/json"}
Post = Callable[[bytes], Awaitable[bytes]]


def request_body() -> bytes:
    """A chat request of a decision's size: system prompt, a few turns of history, the tool."""
    observation = "Step 12/10000\n" + "\n".join(f"row {row}: " + "grass tree water " * 6 for row in range(9))
    messages = [{"role": "system", "content": "You play Crafter. " * 120}]
    for _ in range(3):
        messages += [{"role": "user", "content": observation}, {"role": "assistant", "content": "move_left, do"}]
    tool = {
        "type": "function",
        "function": {
            "name": "interact_many",
            "parameters": {"type": "object", "properties": {"actions": {"type": "array", "items": {"type": "string"}}}},
        },
    }
    return json.dumps({"model": "bench-a1", "messages": messages, "tools": [tool], "max_tokens": 512}).encode()


async def run(stack: str, url: str, calls: int) -> float:
    body = request_body()
    if stack == "outbound":
        async with outbound.open_session(64) as client:
            parsed = outbound.parse_url(url) or url

            async def post(content: bytes) -> bytes:
                answer = await outbound.post(
                    client,
                    parsed,
                    content,
                    HEADERS,
                    connect_timeout_s=CONNECT_S,
                    read_timeout_s=READ_S,
                    total_timeout_s=TOTAL_S,
                    max_bytes=MAX_BYTES,
                )
                return answer.body

            return await _timed(post, body, calls)
    if stack == "aiohttp":
        connector = aiohttp.TCPConnector(limit=64, limit_per_host=0)
        timeout = aiohttp.ClientTimeout(total=TOTAL_S, connect=CONNECT_S, sock_read=READ_S)
        async with aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False
        ) as session:

            async def post(content: bytes) -> bytes:
                async with session.post(
                    url, data=content, headers=HEADERS, timeout=timeout, allow_redirects=False
                ) as response:
                    return await response.read()

            return await _timed(post, body, calls)
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(limits=limits, trust_env=False, timeout=httpx.Timeout(CONNECT_S, read=READ_S)) as hx:

        async def post(content: bytes) -> bytes:
            response = await hx.post(url, content=content, headers=HEADERS)
            return response.content

        return await _timed(post, body, calls)


async def _timed(post: Post, body: bytes, calls: int) -> float:
    await post(body)  # the connection opened outside the count
    os.getppid()  # callgrind's --zero-before=getppid: counting starts here
    start = time.process_time()
    for _ in range(calls):
        await post(body)
    spent = time.process_time() - start
    os.getuid()  # --dump-before=getuid: and ends here
    return spent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", choices=("outbound", "aiohttp", "httpx"), required=True)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--url", help="a running fake model (default: start one)")
    args = parser.parse_args(argv)
    if args.url:
        spent = asyncio.run(run(args.stack, args.url + "/v1/chat/completions", args.calls))
    else:
        with fake_model() as model:
            spent = asyncio.run(run(args.stack, model.url + "/v1/chat/completions", args.calls))
    print(json.dumps({"stack": args.stack, "calls": args.calls, "cpu_us_per_call": spent / max(1, args.calls) * 1e6}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
