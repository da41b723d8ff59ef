"""Soak: mixed rollouts at the concurrency cap for N minutes, 5 % of them against a faulty model.

    python -m benchmarks.soak --quick              # 1 minute (what CI-sized machines run)
    python -m benchmarks.soak --minutes 30         # the real soak
    python -m benchmarks.soak --minutes 5 --out benchmarks/results/soak-5min.json

The task app runs in its own process (`python -m benchmarks.app_server`); a loopback fake model runs
in this one. `--concurrency` workers (default: the cap, 16) each send one request after another:
crafter-react rollouts (plain, returning a structured trace, with step rewards, or against a model
that fails once and then answers), scripted rollouts, replays of a finished run_id, `/run/status`
and `/task_info`. One rollout in twenty (`--fault-rate`) is sent to a model that keeps failing:
HTTP 500, 429, a hang, a dropped connection, invalid JSON, prose without actions, a 10 MB answer.

It passes when
- every request got the answer its kind expects (injected faults end with their precise
  stop_reason / error code; everything else completes), with no 5xx and no transport error;
- the server is idle at the end with the asyncio task count it had idle after warm-up;
- its RSS is flat: the median of the last quarter is within 10 % (+16 MB) of the second quarter's;
- the trace database passes `PRAGMA integrity_check` and holds every answered rollout.

It also reports the server's CPU per stored rollout and the stored rollouts per second, first vs
last quarter (a rising cost means the server slows itself down; see `_cost_trend`).

Bounded caches are sized so they fill during warm-up (run registry 256 entries, 32 seeds), so RSS
growth after it means a leak rather than a cache filling up. Results go to `--out` as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx

from task_app.core.stats import percentile
from task_app.web.local_server import serve_in_thread

from .fake_model import read_body

API_KEY = "soak-Hq7ZkWvRtPxMnBjL"
ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
CAP = 16
SEEDS = 32
REGISTRY_SIZE = 256
MAX_TIME_S = 20.0
SERVER_SETTINGS: dict[str, Any] = {
    "inference_connect_timeout_s": 1.0,
    "inference_read_timeout_s": 1.0,
    "inference_max_attempts": 3,
    "inference_backoff_s": 0.05,
    "inference_backoff_max_s": 0.5,
    "run_registry_size": REGISTRY_SIZE,
    "warm_up": True,
}
# What an injected fault must end with: (stop_reason, metrics.details.error's class, its code or None).
FAULTS: dict[str, tuple[str, str, set[str | None]]] = {
    "http500": ("policy_error", "model_unreachable", {"inference_unavailable"}),
    "http429": ("policy_error", "model_refused", {"inference_rate_limited"}),
    "hang": ("policy_error", "model_timeout", {"inference_timeout"}),
    "drop": ("policy_error", "model_unreachable", {"inference_unavailable"}),
    "garbage": ("policy_unusable", "model_unusable", {None}),
    "prose": ("policy_unusable", "model_unusable", {None}),
    "huge": ("policy_unusable", "model_unusable", {None}),  # a too-large answer is an unusable answer for its decision
}
# Everything else: kind -> weight.
KINDS = {
    "react": 40,
    "react-trace": 10,
    "react-stepwise": 10,
    "react-flaky": 8,
    "scripted": 20,
    "replay": 6,
    "status": 3,
    "task-info": 3,
}


# --- the fake model ---------------------------------------------------------------------------------


def _completion(actions: list[str]) -> bytes:
    call = {
        "id": "call_soak",
        "type": "function",
        "function": {"name": "interact_many", "arguments": json.dumps({"actions": actions})},
    }
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    body = {
        "id": "chatcmpl-soak",
        "object": "chat.completion",
        "created": 0,
        "model": "soak",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 900, "completion_tokens": 20, "total_tokens": 920},
    }
    return json.dumps(body).encode()


_ACTIONS = ("move_left", "move_right", "move_up", "move_down", "do", "do", "noop", "place_table")


class SoakModel:
    """ASGI fake model. The rollout's `model` name says how to behave: `soak-ok`, `soak-flaky-<id>`
    (one 500, then answers), or `soak-<fault>`; answers take 10-40 ms."""

    def __init__(self) -> None:
        self.requests = 0
        self._flaky_seen: set[str] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        raw = await read_body(scope, receive)
        if raw is None:
            return
        body = json.loads(raw or b"{}")
        model = str(body.get("model", "soak-ok"))
        with self._lock:
            self.requests += 1
            first_try = model.startswith("soak-flaky") and model not in self._flaky_seen
            self._flaky_seen.add(model)
        await anyio.sleep(random.uniform(0.01, 0.04))
        await self._answer(model, first_try, receive, send)

    async def _answer(self, model: str, first_try: bool, receive: Any, send: Any) -> None:
        fault = model.removeprefix("soak-")
        if fault == "http500" or first_try:
            await _send(send, 500, b'{"error": {"message": "injected", "type": "server_error"}}')
        elif fault == "http429":
            await _send(send, 429, b'{"error": {"message": "slow down"}}', [(b"retry-after", b"0")])
        elif fault == "hang":
            with anyio.move_on_after(30):
                while (await receive())["type"] != "http.disconnect" and not self._stopping.is_set():
                    pass
        elif fault == "drop":
            transport = getattr(getattr(send, "__self__", None), "transport", None)
            if transport is not None:
                transport.close()
        elif fault == "garbage":
            await _send(send, 200, b'{"choices": [{"message": ')
        elif fault == "prose":
            prose = {"choices": [{"message": {"role": "assistant", "content": "Hmm, let me think."}}]}
            await _send(send, 200, json.dumps(prose).encode())
        elif fault == "huge":
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
            )
            for _ in range(160):  # 10 MB in 64 KB pieces; the app stops reading at 8 MB
                await send({"type": "http.response.body", "body": b" " * 65536, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        else:
            await _send(send, 200, _completion(random.sample(_ACTIONS, k=random.randint(1, 4))))


async def _send(send: Any, status: int, payload: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()), *(headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": payload})


# --- the task app in its own process ---------------------------------------------------------------


@dataclass
class Server:
    process: subprocess.Popen[str]
    url: str

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def cpu_s(self) -> float:
        """User + system CPU seconds of the server process (all its threads)."""
        text = Path(f"/proc/{self.process.pid}/stat").read_text()
        fields = text[text.rfind(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def health(self) -> dict[str, Any]:
        body: dict[str, Any] = httpx.get(self.url + "/health", timeout=10.0, trust_env=False).json()
        return body


@contextlib.contextmanager
def app_server(traces_db: Path, log_path: Path, **overrides: Any) -> Iterator[Server]:
    settings = {"environment_api_key": API_KEY, "traces_db": str(traces_db), **SERVER_SETTINGS, **overrides}
    env = {name: value for name, value in os.environ.items() if not name.startswith("TASKAPP_")}
    env.pop("ENVIRONMENT_API_KEY", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.app_server", "--settings", json.dumps(settings)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            text=True,
        )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"the app server did not start; see {log_path}")
        server = Server(process, f"http://127.0.0.1:{json.loads(line)['port']}")
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(server.url + "/health", timeout=2.0, trust_env=False).status_code == httpx.codes.OK:
                    break
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"the app server did not become ready; see {log_path}")
            time.sleep(0.05)
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)


# --- the load -------------------------------------------------------------------------------------


@dataclass
class Tally:
    outcomes: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    latencies: dict[str, list[float]] = field(default_factory=dict)
    answered: dict[str, int] = field(default_factory=dict)  # run_id -> steps, of every answered rollout
    finished: list[tuple[str, bytes]] = field(default_factory=list)  # (run_id, body) for replays
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, kind: str, ok: bool, elapsed: float, detail: str = "") -> None:
        with self.lock:
            self.outcomes[f"{kind}:{'ok' if ok else 'UNEXPECTED'}"] += 1
            self.latencies.setdefault(kind, []).append(elapsed)
            if not ok:
                self.unexpected.append(f"{kind}: {detail}"[:500])


def _rollout_body(kind: str, model_url: str, rng: random.Random) -> dict[str, Any]:
    decisions = rng.randint(4, 12)
    body: dict[str, Any] = {
        "run_id": f"soak-{kind}-{uuid.uuid4().hex[:12]}",
        "mode": "eval",
        "env": {"env_name": "crafter", "seed": rng.randrange(SEEDS), "config": {}},
        "policy": {"policy_name": "crafter-scripted", "config": {"max_llm_calls": decisions}},
        "ops": ["agent", "env"] * decisions,
        "safety": {"max_time_s": MAX_TIME_S},
    }
    if kind == "scripted":
        return body
    model = f"soak-{kind}" if kind in FAULTS else "soak-ok"
    if kind == "react-flaky":
        model = f"soak-flaky-{uuid.uuid4().hex[:8]}"
    body["policy"] = {
        "policy_name": "crafter-react",
        "config": {"model": model, "inference_url": model_url, "max_llm_calls": decisions},
    }
    if kind == "react-trace":
        body["record"] = {"return_trace": True, "trace_format": "structured"}
    if kind == "react-stepwise":
        body["policy"]["config"]["step_rewards"] = {"enabled": True, "mode": "decision_stepwise"}
    return body


def _check_rollout(kind: str, response: httpx.Response) -> tuple[bool, str]:
    if response.status_code != httpx.codes.OK:
        return False, f"HTTP {response.status_code}: {response.text[:300]}"
    result = response.json()
    details = result["metrics"]["details"]
    error = details.get("error") or {}
    reason, code = details.get("stop_reason"), error.get("code")
    if kind in FAULTS:
        want_reason, want_class, want_codes = FAULTS[kind]
        ok = reason == want_reason and error.get("class") == want_class and code in want_codes
        return ok, f"stop_reason={reason} class={error.get('class')} code={code}"
    stored = details.get("storage", {}).get("trace", {}).get("stored")
    ok = reason == "completed" and stored is True and result["aborted"] is False
    return ok, f"stop_reason={reason} code={code} stored={stored}"


def _one_request(kind: str, client: httpx.Client, model_url: str, tally: Tally, rng: random.Random) -> None:
    started = time.monotonic()
    try:
        if kind == "replay":
            with tally.lock:
                previous = rng.choice(tally.finished) if tally.finished else None
            if previous is None:
                return
            run_id, content = previous
            body = {
                "run_id": run_id,
                "mode": "eval",
                "env": {"env_name": "crafter"},
                "policy": {"policy_name": "crafter-scripted"},
                "ops": ["agent"],
            }
            response = client.post("/rollout", json=body)
            # An entry pushed out of the bounded registry runs again as a new rollout: also correct;
            # and if another worker is re-running the same evicted run_id right now, 409 is the answer.
            ok = (
                response.status_code == httpx.codes.OK
                and (response.content == content or response.json()["run_id"] == run_id)
            ) or (
                response.status_code == httpx.codes.CONFLICT and response.json()["error"]["code"] == "run_in_progress"
            )
            tally.record(kind, ok, time.monotonic() - started, f"HTTP {response.status_code}")
            return
        if kind == "status":
            with tally.lock:
                run_id = rng.choice(list(tally.answered)) if tally.answered else "never-ran"
            response = client.get(f"/run/status/{run_id}")
            ok = response.status_code in (httpx.codes.OK, httpx.codes.NOT_FOUND)  # old entries age out
            tally.record(kind, ok, time.monotonic() - started, f"HTTP {response.status_code}")
            return
        if kind == "task-info":
            response = client.get("/task_info", params={"seed": [rng.randrange(SEEDS) for _ in range(4)]})
            tally.record(kind, response.status_code == httpx.codes.OK, time.monotonic() - started)
            return
        body = _rollout_body(kind, model_url, rng)
        response = client.post("/rollout", json=body)
        ok, detail = _check_rollout(kind, response)
        tally.record(kind, ok, time.monotonic() - started, detail)
        if response.status_code == httpx.codes.OK:
            with tally.lock:
                tally.answered[body["run_id"]] = response.json()["metrics"]["num_steps"]
                if kind not in FAULTS and len(tally.finished) < 512:
                    tally.finished.append((body["run_id"], response.content))
    except httpx.HTTPError as exc:
        tally.record(kind, False, time.monotonic() - started, f"{type(exc).__name__}: {exc}")


def _worker(index: int, server: Server, model_url: str, stop_at: float, fault_rate: float, tally: Tally) -> None:
    rng = random.Random(index)
    kinds, weights = list(KINDS), list(KINDS.values())
    headers = {"X-API-Key": API_KEY}
    with httpx.Client(base_url=server.url, headers=headers, timeout=MAX_TIME_S + 30, trust_env=False) as client:
        while time.monotonic() < stop_at:
            if rng.random() < fault_rate:
                kind = rng.choice(list(FAULTS))
            else:
                kind = rng.choices(kinds, weights)[0]
            _one_request(kind, client, model_url, tally, rng)


# --- monitoring and verdict -----------------------------------------------------------------------


def _sample(server: Server, started: float) -> dict[str, Any]:
    health = server.health()
    return {
        "t_s": round(time.monotonic() - started, 1),
        "rss_mb": round(server.rss_bytes() / 2**20, 1),
        "cpu_s": round(server.cpu_s(), 2),
        "tasks": health["runtime"]["tasks"],
        "threads": health["runtime"]["threads"],
        "active": health["rollouts"]["active"],
        "written": health["storage"].get("written"),
        "storage_failures": health["storage"].get("failures"),
    }


def _idle_tasks(server: Server, target: int | None = None, timeout: float = 30.0) -> int:
    """The task count once no rollout is active (and, given a `target`, once it is reached or `timeout`
    passed: a response still being written holds its task for a moment). Includes /health's own task."""
    deadline = time.monotonic() + timeout
    while True:
        health = server.health()
        tasks: int = health["runtime"]["tasks"]
        idle = health["rollouts"]["active"] == 0 and (target is None or tasks <= target)
        if idle or time.monotonic() > deadline:
            return tasks
        time.sleep(0.1)  # polling interval


def _database(path: Path, answered: dict[str, int]) -> dict[str, Any]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
        sessions = {row[0] for row in conn.execute("SELECT session_id FROM session_traces")}
    missing = sorted(set(answered) - sessions)
    return {"integrity": integrity, "sessions": len(sessions), "answered": len(answered), "missing": missing[:20]}


def _rss_verdict(samples: list[dict[str, Any]]) -> dict[str, Any]:
    rss = [sample["rss_mb"] for sample in samples]
    quarter = max(1, len(rss) // 4)
    second = statistics.median(rss[quarter : 2 * quarter] or rss)
    last = statistics.median(rss[-quarter:])
    limit = second * 1.10 + 16
    return {
        "second_quarter_mb": second,
        "last_quarter_mb": last,
        "limit_mb": round(limit, 1),
        "peak_mb": max(rss),
        "flat": last <= limit,
    }


def _cost_trend(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Server CPU per stored rollout and stored rollouts per second, first vs last quarter of the run.

    A rising CPU cost per rollout means the server slows itself down (e.g. a growing structure); a
    falling rate at a steady cost means the machine was busy with something else."""
    quarter = max(1, (len(samples) - 1) // 4)

    def window(first: dict[str, Any], last: dict[str, Any]) -> dict[str, float]:
        stored = max(1, (last["written"] or 0) - (first["written"] or 0))
        seconds = max(1e-9, last["t_s"] - first["t_s"])
        return {
            "cpu_ms_per_rollout": round(1000 * (last["cpu_s"] - first["cpu_s"]) / stored, 1),
            "stored_per_s": round(stored / seconds, 1),
        }

    if len(samples) < 3:  # two windows need three samples
        return {}
    return {
        "first_quarter": window(samples[0], samples[quarter]),
        "last_quarter": window(samples[-1 - quarter], samples[-1]),
    }


def soak(minutes: float, concurrency: int, fault_rate: float, sample_every_s: float) -> dict[str, Any]:
    model = SoakModel()
    with tempfile.TemporaryDirectory(prefix="soak-") as temporary, serve_in_thread(model) as model_base:
        # the fake model's own complaints about the faults it injects (a dropped connection is an
        # "ASGI callable returned without starting response"; writing on after the app hung up on a
        # 10 MB answer is asyncio's "socket.send() raised exception.") are not the app's: keep them quiet
        logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
        directory = Path(temporary)
        db = directory / "traces.db"
        model_url = model_base + "/v1/chat/completions"
        with app_server(db, directory / "server.log", max_concurrent_rollouts=CAP) as server:
            warm = Tally()
            with httpx.Client(base_url=server.url, headers={"X-API-Key": API_KEY}, timeout=60, trust_env=False) as c:
                for seed in range(SEEDS):  # every world generated once: the world cache is warm
                    body = _rollout_body("scripted", model_url, random.Random(seed))
                    body["env"]["seed"] = seed
                    ok, detail = _check_rollout("scripted", c.post("/rollout", json=body))
                    warm.record("warm-up", ok, 0.0, detail)
            idle_before = _idle_tasks(server)
            started = time.monotonic()
            stop_at = started + minutes * 60
            tally = Tally()
            workers = [
                threading.Thread(target=_worker, args=(index, server, model_url, stop_at, fault_rate, tally))
                for index in range(concurrency)
            ]
            for worker in workers:
                worker.start()
            samples = [_sample(server, started)]
            next_sample = started + sample_every_s
            while any(worker.is_alive() for worker in workers):
                time.sleep(0.1)  # polling interval
                if time.monotonic() >= next_sample:
                    samples.append(_sample(server, started))
                    next_sample += sample_every_s
            for worker in workers:
                worker.join()
            elapsed = time.monotonic() - started
            idle_after = _idle_tasks(server, target=idle_before)
            final = server.health()
            model._stopping.set()
        database = _database(db, tally.answered)  # after a graceful stop: checkpointed and closed
    requests = sum(tally.outcomes.values())
    injected = sum(count for key, count in tally.outcomes.items() if key.split(":")[0] in FAULTS)
    latency = {
        kind: {
            "n": len(values),
            "p50_s": round(statistics.median(values), 3),
            "p99_s": round(percentile(values, 99), 3),
        }
        for kind, values in sorted(tally.latencies.items())
    }
    rss = _rss_verdict(samples[1:] or samples)
    result = {
        "minutes": minutes,
        "elapsed_s": round(elapsed, 1),
        "concurrency": concurrency,
        "cap": CAP,
        "fault_rate": fault_rate,
        "requests": requests,
        "requests_per_s": round(requests / elapsed, 2),
        "rollouts_answered": len(tally.answered),
        "injected_faults": injected,
        "unexpected": len(tally.unexpected),
        "unexpected_examples": tally.unexpected[:10],
        "warm_up_unexpected": warm.unexpected,
        "outcomes": dict(sorted(tally.outcomes.items())),
        "latency": latency,
        "tasks_idle_before": idle_before,
        "tasks_idle_after": idle_after,
        "final_active": final["rollouts"]["active"],
        "storage": {key: final["storage"].get(key) for key in ("status", "written", "failures")},
        "database": database,
        "rss": rss,
        "cost": _cost_trend(samples),
        "samples": samples,
        "model_requests": model.requests,
    }
    result["passed"] = bool(
        not tally.unexpected
        and not warm.unexpected
        and idle_after == idle_before
        and final["rollouts"]["active"] == 0
        and final["storage"].get("failures") == 0
        and database["integrity"] == "ok"
        and not database["missing"]
        and rss["flat"]
    )
    return result


def _summary(result: dict[str, Any]) -> str:
    rss = result["rss"]
    lines = [
        f"soak: {result['elapsed_s']:.0f} s, {result['concurrency']} workers at cap {result['cap']}, "
        f"fault rate {result['fault_rate']:.0%}",
        f"  requests {result['requests']} ({result['requests_per_s']}/s), rollouts answered "
        f"{result['rollouts_answered']}, injected faults {result['injected_faults']}, "
        f"unexpected {result['unexpected']}",
        f"  tasks idle before/after: {result['tasks_idle_before']}/{result['tasks_idle_after']}; active at end "
        f"{result['final_active']}",
        f"  RSS MB: 2nd quarter {rss['second_quarter_mb']}, last quarter {rss['last_quarter_mb']}, peak "
        f"{rss['peak_mb']} (limit {rss['limit_mb']}): {'flat' if rss['flat'] else 'GROWING'}",
        f"  storage: {result['storage']}; database: integrity {result['database']['integrity']}, sessions "
        f"{result['database']['sessions']}, answered {result['database']['answered']}, missing "
        f"{len(result['database']['missing'])}",
    ]
    if result["cost"]:
        first, last = result["cost"]["first_quarter"], result["cost"]["last_quarter"]
        lines.append(
            f"  server CPU per stored rollout: {first['cpu_ms_per_rollout']} ms (first quarter) -> "
            f"{last['cpu_ms_per_rollout']} ms (last); stored/s {first['stored_per_s']} -> {last['stored_per_s']}"
        )
    for kind, stats in result["latency"].items():
        lines.append(f"    {kind:16s} n={stats['n']:5d} p50={stats['p50_s']:.3f}s p99={stats['p99_s']:.3f}s")
    for example in result["unexpected_examples"]:
        lines.append(f"  UNEXPECTED {example}")
    lines.append("PASSED" if result["passed"] else "FAILED")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="soak the task app: mixed rollouts with injected model faults")
    parser.add_argument("--minutes", type=float, default=30.0, help="how long to run (default 30)")
    parser.add_argument("--quick", action="store_true", help="one minute, for a quick check")
    parser.add_argument("--concurrency", type=int, default=CAP, help=f"workers (default: the cap, {CAP})")
    parser.add_argument("--fault-rate", type=float, default=0.05, help="share of rollouts with a faulty model")
    parser.add_argument("--out", type=Path, default=None, help="JSON results (default benchmarks/results/soak*.json)")
    args = parser.parse_args(argv)
    minutes = 1.0 if args.quick else args.minutes
    result = soak(minutes, args.concurrency, args.fault_rate, sample_every_s=5.0 if minutes <= 5 else 15.0)
    out = args.out or RESULTS / ("soak-quick.json" if args.quick else f"soak-{minutes:g}min.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(_summary(result))
    print(f"results: {out}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
