"""Poll `GET <url>/health` every `--interval` seconds until SIGINT, then print the latencies (ms, JSON).

A failed check is `Infinity`, so it shows in the p99 instead of ending the poller.

Its own process, so the latencies hold the server's answer time and nothing of the benchmark
client's work (a thread inside the client waits for the client's GIL whenever it parses responses).
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import time

import httpx


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("url")
    parser.add_argument("--interval", type=float, default=0.05)
    args = parser.parse_args(argv)
    # A flag, not a threading.Event: the handler runs in the main thread, and Event.set() there deadlocks
    # when the signal lands while Event.wait() holds the Event's lock (a full run hung so).
    stopped = False

    def stop(*_: object) -> None:
        nonlocal stopped
        stopped = True

    signal.signal(signal.SIGINT, stop)
    latencies = []
    with httpx.Client(timeout=30.0) as http:
        print("ready", flush=True)
        while True:
            time.sleep(args.interval)
            if stopped:
                break
            started = time.perf_counter()
            try:
                http.get(args.url + "/health").raise_for_status()
            except httpx.HTTPError:
                latencies.append(math.inf)  # a failed check, which a load balancer counts as down
                continue
            latencies.append((time.perf_counter() - started) * 1000)
    print(json.dumps(latencies), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
