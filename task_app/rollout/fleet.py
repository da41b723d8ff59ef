"""The fleet's record of every run, in the state store (TASKAPP_STATE_BACKEND): any process answers for any run.

    run/<id>/<n>/claim      attempt n of run <id>: {"o": owner or null, "at"}; put_if_absent: one submission wins it
    run/<id>/<n>/start      (run elsewhere) the process that runs it: {"o", "at"}; put_if_absent: one executor
    run/<id>/<n>/queued     (run elsewhere) the hand-over happened: the platform holds the work
    run/<id>/<n>/req/<k>    (run elsewhere) the validated request (JSON), in parts
    run/<id>/<n>/abort      an abort, asked for by any process
    run/<id>/<n>/end        how it ended: status, times, final progress, the response's size and parts
    run/<id>/<n>/res/<k>    the response bytes, in parts of PART_BYTES, with the result TTL
    run/<id>/<n>/callback   what the callback_url answered
    proc/<p>/live           process p's heartbeat: {"beat", "runs": {run_id: [attempt, status, progress]}}
    proc/<p>/bell           rung (a fresh random value) after an abort flag was written for one of p's runs

Every run key but the response parts lives `ttl_s` (TASKAPP_RUNS_TTL_S): that long a finished run_id is
remembered. A process is an `instance`, a random id drawn when its app starts.

Why this holds without compare-and-set (the store's one atomic primitive is put_if_absent):
- One run per attempt: attempt n is claimed with put_if_absent, so of two processes that submit one run_id
  at once exactly one runs it and the other finds the claim. A lost run is submitted again by claiming
  attempt n+1: exactly one resubmission wins again.
- Lost: an owner lists its runs in every heartbeat. A run is lost when its owner's heartbeat is older than
  `lost_after_s`, or fresh but without the run. The owner registers a run before claiming it and takes
  the beat's time before it lists its runs, so a beat later than the claim lists the run unless it ended;
  a run writes `end` before it leaves the heartbeat, and a reader that finds a run lost reads `end` once
  more, so a run that just ended is never reported lost. A run is declared lost at most `lost_after_s`
  after its process stopped (plus one store call), and never while its process beats.
- Abort: the aborter writes the flag, then rings the owner's bell; the owner polls its one bell key and,
  when it changed, reads the flags of all its runs. For a run handed over and not started yet, the
  executor claims `start` and then reads the flag, the aborter writes the flag and then reads `start` (and
  rings that owner): whichever comes second sees the other's write.
- Values are JSON this app made, or the response bytes it sent: nothing is unpickled.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..core.errors import Conflict
from ..core.json_codec import dumps_bytes, loads
from ..core.settings import Settings
from ..store import StateStore
from .control import RunStatus

PART_BYTES = 1 << 20  # modal.Dict refuses requests above an undocumented size (413): responses go in parts
PROBE = 4  # attempts read per round trip when looking for a run's latest attempt
MAX_CLAIMS = 8  # attempts one submission tries before it gives up (409)


@dataclass(frozen=True, slots=True)
class RunLimits:
    ttl_s: float  # a run_id is remembered this long after it was claimed
    result_ttl_s: float  # a response is kept this long
    heartbeat_s: float
    lost_after_s: float

    @classmethod
    def from_settings(cls, settings: Settings) -> RunLimits:
        return cls(
            settings.runs_ttl_s, settings.runs_result_ttl_s, settings.runs_heartbeat_s, settings.runs_lost_after_s
        )

    @property
    def live_ttl_s(self) -> float:
        return 2 * self.lost_after_s


def _key(run_id: str, attempt: int, name: str) -> str:
    return f"run/{run_id}/{attempt}/{name}"


def _parts(run_id: str, attempt: int, name: str, count: int) -> list[str]:
    return [_key(run_id, attempt, f"{name}/{index}") for index in range(count)]


def _dumps(value: Any) -> bytes:
    return dumps_bytes(value)


def _loads(raw: bytes | None) -> Any:
    return None if raw is None else loads(raw)


def iso(moment: float | None) -> str | None:
    return None if moment is None else datetime.fromtimestamp(moment, UTC).isoformat()


def part_count(size: int) -> int:
    return max(1, -(-size // PART_BYTES))


def new_instance() -> str:
    return secrets.token_urlsafe(9)


@dataclass(slots=True)
class RunView:
    """One attempt of a run as the fleet sees it."""

    run_id: str
    attempt: int
    status: RunStatus
    started_at: float | None
    finished_at: float | None = None
    progress: dict[str, Any] | None = None
    owner: str | None = None
    end: dict[str, Any] | None = None
    callback: dict[str, Any] | None = None

    @property
    def reusable(self) -> bool:
        """Lost, or ended without a response (it never produced anything): the run_id may run again."""
        return self.status is RunStatus.LOST or (self.end is not None and not self.end.get("parts"))

    def body(self) -> dict[str, Any]:
        """The status answer (`/run/status/{run_id}`, `GET /runs/{run_id}`)."""
        body: dict[str, Any] = {
            "run_id": self.run_id,
            "status": self.status.value,
            "attempt": self.attempt,
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
            "progress": dict(self.progress or {}),
        }
        if self.callback is not None:
            body["callback"] = self.callback
        if self.end is not None and self.end.get("error"):
            body["error"] = self.end["error"]
        return body


class FleetRuns:
    """The store operations of the run registry (one per process)."""

    def __init__(self, store: StateStore, instance: str, limits: RunLimits) -> None:
        self.store = store
        self.instance = instance
        self.limits = limits
        self._bell: bytes | None = None

    def now(self) -> float:
        return self.store.clock()

    # --- claiming -------------------------------------------------------------------------------

    async def claim(
        self,
        run_id: str,
        owner: str | None,
        request: bytes | None = None,
        trying: Callable[[int], None] = lambda attempt: None,
    ) -> tuple[int, RunView | None]:
        """Take the run_id for a new attempt: `(attempt, None)`, or `(attempt, view)` when it is taken (and
        not `reusable`). `owner` None: the run is handed over to be run elsewhere (`start` will say who runs it),
        and its `request` is stored for that process. `trying(n)` is called before attempt n is claimed
        (the registry lists the run under that attempt in its heartbeats)."""
        attempt = 0
        for _ in range(MAX_CLAIMS):
            trying(attempt)
            parts = part_count(len(request)) if request is not None else 0
            value = _dumps({"o": owner, "at": self.now(), "req": parts})
            if await self.store.put_if_absent(_key(run_id, attempt, "claim"), value, ttl_s=self.limits.ttl_s):
                if request is not None:
                    await self._put_parts(run_id, attempt, "req", request, self.limits.ttl_s)
                return attempt, None
            view = await self.view(run_id, attempt)
            if view is None:  # the claim expired in between: try it again
                continue
            if not view.reusable:
                return view.attempt, view
            attempt = view.attempt + 1
        raise Conflict(f"run {run_id!r} is being submitted elsewhere too; retry", code="run_in_progress", run_id=run_id)

    async def start(self, run_id: str, attempt: int) -> bool:
        """The executor of a handed-over run takes it (False: another executor has it)."""
        value = _dumps({"o": self.instance, "at": self.now()})
        return await self.store.put_if_absent(_key(run_id, attempt, "start"), value, ttl_s=self.limits.ttl_s)

    async def mark_queued(self, run_id: str, attempt: int) -> None:
        await self.store.put(_key(run_id, attempt, "queued"), _dumps({"at": self.now()}), ttl_s=self.limits.ttl_s)

    async def request(self, run_id: str, attempt: int) -> bytes | None:
        claim = _loads(await self.store.get(_key(run_id, attempt, "claim")))
        return None if claim is None else await self._get_parts(run_id, attempt, "req", int(claim.get("req", 0)))

    # --- reading --------------------------------------------------------------------------------

    async def _latest(self, run_id: str, start: int) -> tuple[int, dict[str, Any]] | None:
        found: tuple[int, dict[str, Any]] | None = None
        while True:
            attempts = range(start, start + PROBE)
            raws = await self.store.get_many([_key(run_id, attempt, "claim") for attempt in attempts])
            for attempt, raw in zip(attempts, raws, strict=True):
                if raw is None:
                    return found
                found = attempt, _loads(raw)
            start += PROBE

    async def view(self, run_id: str, start: int = 0) -> RunView | None:
        """The latest attempt from `start` on, or None for a run_id the fleet does not know."""
        latest = await self._latest(run_id, start)
        if latest is None:
            return None
        attempt, claim = latest
        names = ("end", "start", "queued", "callback")
        end, started, queued, callback = map(
            _loads, await self.store.get_many([_key(run_id, attempt, name) for name in names])
        )
        view = await self._judge(run_id, attempt, claim, end, started, queued is not None)
        if view.status is RunStatus.LOST:  # it may have ended since `end` was read
            end = _loads(await self.store.get(_key(run_id, attempt, "end")))
            if end is not None:
                view = self._ended(run_id, attempt, end)
        view.callback = callback
        return view

    def _ended(self, run_id: str, attempt: int, end: dict[str, Any]) -> RunView:
        return RunView(run_id, attempt, RunStatus(end["s"]), end["st"], end["ft"], end["p"], end.get("o"), end)

    async def _judge(
        self,
        run_id: str,
        attempt: int,
        claim: dict[str, Any],
        end: dict[str, Any] | None,
        started: dict[str, Any] | None,
        queued: bool,
    ) -> RunView:
        if end is not None:
            return self._ended(run_id, attempt, end)
        now, bound = self.now(), self.limits.lost_after_s
        holder = claim if claim.get("o") else started
        if holder is None:  # handed over, not started: queued while the hand-over stands
            fresh = queued or now - float(claim["at"]) <= bound
            return RunView(run_id, attempt, RunStatus.QUEUED if fresh else RunStatus.LOST, float(claim["at"]))
        owner, since = str(holder["o"]), float(holder["at"])
        view = RunView(run_id, attempt, RunStatus.LOST, since, owner=owner)
        live = _loads(await self.store.get(f"proc/{owner}/live")) if owner != self.instance else None
        if live is None or now - float(live["beat"]) > bound:
            if now - since <= bound and owner != self.instance:  # its first beat is yet to come
                view.status = RunStatus.RUNNING
            return view
        listed = live["runs"].get(run_id)
        if listed is not None and listed[0] == attempt:
            view.status, view.progress = RunStatus(listed[1]), listed[2]
        elif float(live["beat"]) <= since:  # the beat is older than the claim: not listed yet
            view.status = RunStatus.RUNNING
        return view

    # --- ending ---------------------------------------------------------------------------------

    async def finish(self, view: RunView, response: bytes | None, error: dict[str, Any] | None = None) -> int:
        """Store the response (in parts), then the end record; the number of parts."""
        parts = 0
        if response is not None:
            parts = await self._put_parts(view.run_id, view.attempt, "res", response, self.limits.result_ttl_s)
        end = {
            "s": view.status.value,
            "st": view.started_at,
            "ft": view.finished_at,
            "p": view.progress or {},
            "o": self.instance,
            "parts": parts,
            "bytes": len(response) if response is not None else 0,
        }
        if error is not None:
            end["error"] = error
        await self.store.put(_key(view.run_id, view.attempt, "end"), _dumps(end), ttl_s=self.limits.ttl_s)
        view.end = end
        return parts

    async def response(self, view: RunView) -> bytes | None:
        """The stored response of an ended run, or None when there is none (any more)."""
        if view.end is None or not view.end.get("parts"):
            return None
        body = await self._get_parts(view.run_id, view.attempt, "res", int(view.end["parts"]))
        return body if body is not None and len(body) == view.end["bytes"] else None

    async def record_callback(self, run_id: str, attempt: int, outcome: dict[str, Any]) -> None:
        await self.store.put(_key(run_id, attempt, "callback"), _dumps(outcome), ttl_s=self.limits.ttl_s)

    async def forget_response(self, run_id: str, attempt: int, parts: int) -> None:
        await self.store.delete(_parts(run_id, attempt, "res", parts))

    async def forget(self, run_id: str, attempt: int, parts: int) -> None:
        """Everything of a finished attempt: the run_id is free again."""
        names = ("claim", "start", "queued", "abort", "end", "callback")
        keys = [_key(run_id, attempt, name) for name in names]
        await self.store.delete(keys + _parts(run_id, attempt, "res", parts))

    # --- aborting and the heartbeat ---------------------------------------------------------------

    async def request_abort(self, view: RunView) -> None:
        await self.store.put(_key(view.run_id, view.attempt, "abort"), _dumps(self.now()), ttl_s=self.limits.ttl_s)
        owner = view.owner
        if owner is None:  # handed over: ring whoever started it meanwhile
            started = _loads(await self.store.get(_key(view.run_id, view.attempt, "start")))
            owner = None if started is None else str(started["o"])
        if owner is not None:
            await self.store.put(f"proc/{owner}/bell", secrets.token_bytes(8), ttl_s=self.limits.live_ttl_s)

    async def aborted(self, runs: Sequence[tuple[str, int]]) -> list[bool]:
        raws = await self.store.get_many([_key(run_id, attempt, "abort") for run_id, attempt in runs])
        return [raw is not None for raw in raws]

    async def bell_rang(self) -> bool:
        """Whether this process's bell changed since the last look."""
        value = await self.store.get(f"proc/{self.instance}/bell")
        rang, self._bell = value != self._bell, value
        return rang

    async def beat(self, at: float, runs: dict[str, list[Any]]) -> None:
        body = _dumps({"beat": at, "runs": runs})
        await self.store.put(f"proc/{self.instance}/live", body, ttl_s=self.limits.live_ttl_s)

    # --- parts ----------------------------------------------------------------------------------

    async def _put_parts(self, run_id: str, attempt: int, name: str, data: bytes, ttl_s: float) -> int:
        count = part_count(len(data))
        for index, key in enumerate(_parts(run_id, attempt, name, count)):
            await self.store.put(key, data[index * PART_BYTES : (index + 1) * PART_BYTES], ttl_s=ttl_s)
        return count

    async def _get_parts(self, run_id: str, attempt: int, name: str, count: int) -> bytes | None:
        if count == 0:
            return None
        chunks = await self.store.get_many(_parts(run_id, attempt, name, count))
        return None if any(chunk is None for chunk in chunks) else b"".join(chunk or b"" for chunk in chunks)
