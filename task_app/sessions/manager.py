"""EnvSessions: create, reset, step, snapshot, restore, branch and terminate envs, from any process.

    request ─► acquire(env_id): the live env (cache hit, or rebuilt from the store), its lock, its rate
               bucket, its slot refreshed ─► claim the next log index (put_if_absent) ─► apply it
               (a step on the loop, a reset in a worker thread) ─► every K entries, a checkpoint ─► the
               view the routes answer with

The state of record is the env's log in the state store (`records.py`): crafter is deterministic given
the seed and the actions, so the log (plus a checkpoint every `checkpoint_every` entries) *is* the env,
and any process can rebuild it by loading the latest checkpoint and replaying at most K entries.

Ordering without compare-and-set. Entry n of an env is written with `put_if_absent(log/n)`, before it
is applied: exactly one writer wins index n, on every backend. A process whose claim fails is behind:
it reads the entries it missed, applies them, and claims the next index (at most
`MAX_CLAIM_ATTEMPTS` times, then 409 `env_busy`). So two processes stepping one env at once never
fork it; their steps are ordered by the log, and each response describes the state after its own
step. A claimed entry is durable before the step is answered; a process killed after claiming and
before answering leaves the step in the log (applied by whoever serves the env next), so a client
that retries an unanswered step may find it applied twice, but nothing answered is ever lost.

Expiry. Each env holds one of `max_envs` slots (`slots/<i>`, claimed with put_if_absent, with the
idle TTL), refreshed while the env is used: when `REFRESH_FRACTION` of the TTL has passed since the
last refresh this process knows of. An env whose slot lapsed has expired (410 from then on): it
expires between 0.9 and 1.0 TTL after its last request. The slots also make the store's env count a
cap without a counter: a create that finds no free slot gets 429.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from ..core.errors import Conflict, Gone, InvalidRequest, NotFound, RateLimited, TaskAppError
from ..core.json_codec import dumps_bytes, loads
from ..core.offload import Offload, run_in_thread
from ..core.tasks import Task, Tasks, check_area
from ..game import ActionPlan, DecisionOutcome, Game, Observation, WorldFactory, normalise_tool_calls
from ..game.checkpoint import dump_game, load_game
from ..store import StateStore
from .env_spec import EnvSpec, SessionLimits, check_seed
from .live import Episode, LiveCache, LiveEnv, RateBucket, retry_after
from .records import (
    END,
    ENV_KEYS,
    EXPIRED,
    RESET,
    STEP,
    TERMINATED,
    EnvMeta,
    Origin,
    checkpoint_key,
    decode_meta,
    ended,
    expired,
    hint_key,
    log_key,
    marker_key,
    meta_key,
    new_id,
    not_found,
    snapshot_key,
    valid_id,
)
from .slots import Slots

logger = logging.getLogger(__name__)

MAX_CLAIM_ATTEMPTS = 8
REFRESH_FRACTION = 0.1
CATCH_UP_BATCH = 2  # log entries read per round trip when catching up (usually 0 or 1 are new)
MAX_READ_BATCH = 256  # log entries read per round trip when rebuilding


@dataclass(frozen=True, slots=True)
class EnvView:
    """An env after an operation: what every route's answer is built from."""

    env_id: str
    observation: Observation
    step_idx: int  # crafter steps in the current episode
    episode: int
    calls: int  # step calls that ran in the current episode
    episode_id: str  # the id its reset named it by, else `<env_id>-<episode>`
    task_id: str | None  # the task whose world the current episode plays, if any
    seed: int
    done: bool
    truncated: bool
    outcome: DecisionOutcome | None = None
    plan: ActionPlan | None = None
    episode_over: bool = False  # a step on an episode that had already ended: nothing ran

    @property
    def reward(self) -> float:
        """Crafter's own reward, summed over the actions this call executed."""
        return sum(result.native_reward for result in self.outcome.results) if self.outcome else 0.0


def view_of(
    env_id: str,
    game: Game,
    episode: Episode,
    observation: Observation,
    outcome: DecisionOutcome | None = None,
    plan: ActionPlan | None = None,
    episode_over: bool = False,
    task_id: str | None = None,
) -> EnvView:
    return EnvView(
        env_id=env_id,
        observation=observation,
        step_idx=game.env.step_count,
        episode=episode.number,
        calls=episode.calls,
        episode_id=episode.episode_id or f"{env_id}-{episode.number}",
        task_id=task_id,
        seed=int(game.env._seed),
        done=game.done,
        truncated=game.truncated,
        outcome=outcome,
        plan=plan,
        episode_over=episode_over,
    )


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    snapshot_id: str
    size: int
    rl_run_id: str | None
    key: str


def _split_snapshot(raw: bytes) -> tuple[dict[str, Any], bytes]:
    header, _, checkpoint = raw.partition(b"\n")  # compact JSON never holds a raw newline
    return loads(header), checkpoint


class EnvSessions:
    """One per process (the lifespan's); every method may be called concurrently from the event loop."""

    def __init__(
        self,
        store: StateStore,
        worlds: WorldFactory,
        limits: SessionLimits,
        offload: Offload = run_in_thread,
        monotonic: Callable[[], float] = time.monotonic,
        tasks: Tasks | None = None,
    ) -> None:
        self.store = store
        self.worlds = worlds
        self.limits = limits
        self.tasks = tasks  # names the task of each view's world (none without it)
        self.offload = offload
        self.monotonic = monotonic
        self.live = LiveCache(limits.max_live, monotonic)
        self.slots = Slots(store, limits)
        self.counters = {"created": 0, "rebuilds": 0, "replayed": 0, "conflicts": 0, "checkpoints": 0, "reaped": 0}

    # --- operations ---------------------------------------------------------------------------------

    async def create(self, spec: EnvSpec) -> EnvView:
        self.live.make_room()
        meta = await self._register(spec, None, None)

        def build() -> tuple[Game, Observation]:
            game = self._fresh(spec.seed, meta)
            return game, game.observe()

        try:
            game, observation = await self.offload(build)
        except BaseException:
            await self._retire(meta, TERMINATED)
            raise
        live = self.live.add(self._live(meta, game, Episode(), self.store.clock()))
        self.counters["created"] += 1
        return self._view(live, observation)

    async def reset(
        self, env_id: str, seed: int | None, *, task: Task | None = None, episode_id: str | None = None
    ) -> EnvView:
        """A new episode: of `task`'s world (it must have the env's area), of `seed`'s, or of the current
        seed's; `episode_id` names it (OpenEnv)."""
        async with self._acquire(env_id) as live:
            self._check_steps(live)
            check_area(task, live.meta.area)
            if task is not None:
                chosen = task.seed
            else:
                chosen = live.seed if seed is None else check_seed(seed, self.limits)
            entry: dict[str, Any] = {"op": RESET, "seed": chosen, "t": self.store.clock()}
            if episode_id is not None:
                entry["eid"] = episode_id
            _, observation = await self._append(live, entry)
            return self._view(live, observation)

    async def step(self, env_id: str, tool_calls: Sequence[object]) -> EnvView:
        plan = normalise_tool_calls(tool_calls, self.limits.max_actions)
        async with self._acquire(env_id) as live:
            if live.game.done:
                await self._catch_up(live)  # a reset or an end may have happened elsewhere
            if live.game.done:
                observation = await self.offload(live.game.observe)
                return self._view(live, observation, plan=plan, episode_over=True)
            self._check_steps(live)
            entry = {"op": STEP, "a": list(plan.actions), "t": self.store.clock()}
            outcome, observation = await self._append(live, entry)
            return self._view(live, observation, outcome=outcome, plan=plan)

    async def state(self, env_id: str) -> EnvView:
        async with self._acquire(env_id) as live:
            await self._catch_up(live)
            observation = await self.offload(live.game.observe)
            return self._view(live, observation)

    async def snapshot(self, env_id: str) -> SnapshotInfo:
        async with self._acquire(env_id) as live:
            await self._catch_up(live)
            snapshot_id = new_id()
            live.snapshot_hint = await self.slots.claim_snapshot(env_id, snapshot_id, live.snapshot_hint)
            spec, checkpoint = await self._copy(live)
            header = {"v": 1, "source": env_id, "spec": spec.as_dict(), "created_at": self.store.clock()}
            record = dumps_bytes(header) + b"\n" + checkpoint
            await self.store.put(snapshot_key(snapshot_id), record, ttl_s=self.limits.ttl_s)
            return SnapshotInfo(snapshot_id, len(record), live.meta.rl_run_id, snapshot_key(snapshot_id))

    async def restore(self, snapshot_id: str) -> EnvView:
        spec, checkpoint, _ = await self.read_snapshot(snapshot_id)
        return await self.adopt(spec, checkpoint, snapshot_id)

    async def read_snapshot(self, snapshot_id: str) -> tuple[EnvSpec, bytes, dict[str, Any]]:
        """A snapshot's spec, checkpoint and what a rollout carried in it (`save_snapshot`; {} otherwise)."""
        raw = await self.store.get(snapshot_key(snapshot_id)) if valid_id(snapshot_id) else None
        if raw is None:
            raise NotFound(f"snapshot {snapshot_id!r} not found", code="snapshot_not_found", snapshot_id=snapshot_id)
        header, checkpoint = _split_snapshot(raw)
        carried = header.get("carried")
        return EnvSpec.from_dict(header["spec"]), checkpoint, carried if isinstance(carried, dict) else {}

    async def save_snapshot(self, spec: EnvSpec, checkpoint: bytes, carried: dict[str, Any]) -> str:
        """A snapshot of a game held outside the store (a rollout's last state, `record.snapshot`), with
        `carried` (JSON data of the rollout's) beside it; restored and continued like any other."""
        snapshot_id = new_id()
        header = {"v": 1, "source": None, "spec": spec.as_dict(), "created_at": self.store.clock(), "carried": carried}
        await self.store.put(
            snapshot_key(snapshot_id), dumps_bytes(header) + b"\n" + checkpoint, ttl_s=self.limits.ttl_s
        )
        return snapshot_id

    async def current(self, env_id: str) -> tuple[EnvSpec, bytes]:
        """The env's spec and a checkpoint of its current state; the env itself is not changed."""
        async with self._acquire(env_id) as live:
            await self._catch_up(live)
            return await self._copy(live)

    async def adopt(self, spec: EnvSpec, checkpoint: bytes, parent: str | None) -> EnvView:
        """A new env that starts from `checkpoint` (`dump_game` of a game of `spec`, with its `Episode`
        as extra): a restored snapshot, or a game this process held outside the store."""
        self.live.make_room()
        meta = await self._register(spec, checkpoint, parent)

        def build() -> tuple[Game, Episode, Observation]:
            game, episode = self._load(checkpoint, meta)
            return game, episode, game.observe()

        try:
            game, episode, observation = await self.offload(build)
        except BaseException:
            await self._retire(meta, TERMINATED)
            raise
        live = self.live.add(self._live(meta, game, episode, self.store.clock()))
        return self._view(live, observation)

    async def branch(self, env_ids: Sequence[str], num_children: int) -> dict[str, list[str]]:
        """`num_children` independent copies of each env's current state (records only: each child is
        rebuilt, in a few milliseconds, by the first process that serves it)."""
        if len(env_ids) * num_children > self.limits.max_children:
            raise InvalidRequest(
                f"a branch call may create at most {self.limits.max_children} envs", code="too_many_children"
            )
        copies: list[tuple[str, EnvSpec, bytes]] = []
        for env_id in dict.fromkeys(env_ids):
            async with self._acquire(env_id) as live:
                await self._catch_up(live)
                spec, checkpoint = await self._copy(live)
                copies.append((env_id, spec, checkpoint))
        children: dict[str, list[str]] = {}
        created: list[EnvMeta] = []
        try:
            for env_id, spec, checkpoint in copies:
                for _ in range(num_children):
                    created.append(await self._register(spec, checkpoint, env_id))
                    children.setdefault(env_id, []).append(created[-1].env_id)
        except BaseException:
            for meta in created:  # nothing half-made outlives a failed call
                await self._retire(meta, TERMINATED)
            raise
        return children

    async def terminate(self, env_id: str) -> None:
        async with self._acquire(env_id) as live:
            await self._append(live, {"op": END, "why": TERMINATED, "t": self.store.clock()})
            await self._retire(live.meta, TERMINATED)

    # --- acquiring a live env -----------------------------------------------------------------------

    @asynccontextmanager
    async def _acquire(self, env_id: str) -> AsyncIterator[LiveEnv]:
        if not valid_id(env_id):
            raise not_found(env_id)
        live = self.live.get(env_id)
        if live is None:
            self.live.make_room()
            live = self.live.add(await self._rebuild(env_id))
        async with live.lock:
            wait = live.bucket.take(self.monotonic())
            if wait:
                raise RateLimited(
                    f"env {env_id!r} gets at most {self.limits.rate_per_s:g} requests per second",
                    code="env_rate_limited",
                    retry_after_s=retry_after(wait),
                )
            try:
                await self._refresh_slot(live)
                yield live
            except (Gone, NotFound):
                self.live.drop(env_id)
                raise
            except TaskAppError:
                raise
            except BaseException:  # the live game may be half-updated: the store has the truth
                self.live.drop(env_id)
                raise

    async def _refresh_slot(self, live: LiveEnv) -> None:
        now = self.store.clock()
        if now - live.slot_at < self.limits.ttl_s * REFRESH_FRACTION:
            return
        if await self.slots.held_since(live.meta.slot, live.env_id) is None:
            decode_meta(live.env_id, await self.store.get(meta_key(live.env_id)))  # raises if it ended
            await self._retire(live.meta, EXPIRED)
            raise expired(live.env_id)
        await self.slots.refresh(live.meta.slot, live.env_id, now)
        live.slot_at = now

    async def _rebuild(self, env_id: str) -> LiveEnv:
        """The env from the store: its meta, its slot, the latest checkpoint and the log after it."""
        raw_meta, raw_hint = await self.store.get_many([meta_key(env_id), hint_key(env_id)])
        meta = decode_meta(env_id, raw_meta)
        slot_at = await self.slots.held_since(meta.slot, env_id)
        if slot_at is None:
            await self._retire(meta, EXPIRED)
            raise expired(env_id)
        every = self.limits.checkpoint_every
        hinted = int(loads(raw_hint)) if raw_hint is not None else 0
        at_hint, after_hint = await self.store.get_many(
            [checkpoint_key(env_id, hinted), checkpoint_key(env_id, hinted + 1)]
        )
        index, checkpoint = (hinted + 1, after_hint) if after_hint is not None else (hinted, at_hint)
        if checkpoint is None and meta.origin == "checkpoint":
            index, checkpoint = 0, await self.store.get(checkpoint_key(env_id, 0))
        elif checkpoint is None:
            index = 0
        entries = await self._read_log(env_id, index * every, min(every + 1, MAX_READ_BATCH))

        def build() -> tuple[Game, Episode, int, dict[str, Any] | None]:
            if checkpoint is not None:
                game, episode = self._load(checkpoint, meta)
            else:
                game, episode = self._fresh(meta.seed, meta), Episode()
            return self._replay(meta, game, episode, entries)

        game, episode, applied, end = await self.offload(build)
        head = index * every + applied
        self.counters["rebuilds"] += 1
        self.counters["replayed"] += applied
        if end is not None:
            await self._retire(meta, str(end.get("why", TERMINATED)))
            raise ended(env_id, str(end.get("why")))
        return self._live(meta, game, episode, slot_at, head)

    # --- the log --------------------------------------------------------------------------------------

    async def _read_log(self, env_id: str, start: int, batch: int) -> list[dict[str, Any]]:
        """Entries from `start` up to the first missing index (claims leave no holes)."""
        entries: list[dict[str, Any]] = []
        while True:
            first = start + len(entries)
            values = await self.store.get_many([log_key(env_id, first + offset) for offset in range(batch)])
            for value in values:
                if value is None:
                    return entries
                entries.append(loads(value))

    async def _catch_up(self, live: LiveEnv) -> None:
        entries = await self._read_log(live.env_id, live.head, CATCH_UP_BATCH)
        if not entries:
            return
        game, episode, applied, end = await self.offload(
            lambda: self._replay(live.meta, live.game, live.episode, entries)
        )
        live.game, live.episode, live.head = game, episode, live.head + applied
        self.counters["replayed"] += applied
        if end is not None:
            await self._retire(live.meta, str(end.get("why", TERMINATED)))
            raise ended(live.env_id, str(end.get("why")))

    async def _append(self, live: LiveEnv, entry: dict[str, Any]) -> tuple[DecisionOutcome | None, Observation]:
        """Claim the next log index for `entry` (catching up while others hold it), then apply it."""
        data = dumps_bytes(entry)
        for _ in range(MAX_CLAIM_ATTEMPTS):
            if await self.store.put_if_absent(log_key(live.env_id, live.head), data):
                if entry["op"] == STEP and live.meta.image_size is None:  # on the loop: cheaper than a handoff
                    result = self._apply(live, entry)
                else:  # a reset may generate a world, a frame takes a PNG encoding (milliseconds): a thread's
                    result = await self.offload(lambda: self._apply(live, entry))
                live.head += 1
                await self._checkpoint(live)
                return result
            self.counters["conflicts"] += 1
            await self._catch_up(live)
        raise Conflict(
            f"env {live.env_id!r} is being stepped elsewhere faster than this request could take its turn",
            code="env_busy",
        )

    def _apply(self, live: LiveEnv, entry: dict[str, Any]) -> tuple[DecisionOutcome | None, Observation]:
        """One entry this process claimed, and the observation after it (a step on the loop, a reset in a
        worker thread: `_append`)."""
        outcome = None
        if entry["op"] == STEP:
            outcome = live.game.apply(ActionPlan(tuple(entry["a"])))
            live.episode = live.episode.stepped()
        elif entry["op"] == RESET:
            replaced, live.game = live.game, self._fresh(int(entry["seed"]), live.meta)
            live.episode = live.episode.next(entry.get("eid"))
            replaced.close()
        return outcome, live.game.observe()

    def _replay(
        self, meta: EnvMeta, game: Game, episode: Episode, entries: list[dict[str, Any]]
    ) -> tuple[Game, Episode, int, dict[str, Any] | None]:
        """Worker thread: apply entries in order; stops at an end entry (returned)."""
        for applied, entry in enumerate(entries):
            if entry["op"] == STEP:
                game.apply(ActionPlan(tuple(entry["a"])))
                episode = episode.stepped()
            elif entry["op"] == RESET:
                replaced, game, episode = game, self._fresh(int(entry["seed"]), meta), episode.next(entry.get("eid"))
                replaced.close()
            else:
                return game, episode, applied, entry
        return game, episode, len(entries), None

    async def _checkpoint(self, live: LiveEnv) -> None:
        every = self.limits.checkpoint_every
        if live.head % every:
            return
        index = live.head // every
        # On the loop: envs stepped in lockstep checkpoint together, and a burst of handoffs to the
        # worker threads stalled the loop longer than the dumps take (docs/decisions/step-path.md).
        data = dump_game(live.game, live.episode.as_extra())
        await self.store.put(checkpoint_key(live.env_id, index), data)
        await self.store.put(hint_key(live.env_id), dumps_bytes(index))
        self.counters["checkpoints"] += 1

    def _check_steps(self, live: LiveEnv) -> None:
        if live.head >= self.limits.max_steps:
            raise Conflict(
                f"env {live.env_id!r} has taken {self.limits.max_steps} steps and resets, its limit; "
                "snapshot and restore it, or create a new env",
                code="env_step_limit",
            )

    # --- records ------------------------------------------------------------------------------------

    async def _register(self, spec: EnvSpec, checkpoint: bytes | None, parent: str | None) -> EnvMeta:
        """Write a new env's record (slot, checkpoint 0, marker, meta) and return its meta."""
        env_id = new_id()
        slot = await self.slots.claim(env_id)
        origin: Origin = "seed" if checkpoint is None else "checkpoint"
        meta = EnvMeta.new(spec, env_id, slot, origin, parent, self.store.clock())
        try:
            if checkpoint is not None:
                await self.store.put(checkpoint_key(env_id, 0), checkpoint)
            await self.store.put(marker_key(env_id), dumps_bytes({"slot": slot, "at": meta.created_at}))
            await self.store.put(meta_key(env_id), meta.encode())
        except BaseException:
            await self.slots.release(slot, env_id)
            raise
        return meta

    async def _retire(self, meta: EnvMeta, why: str) -> None:
        """An env that ended: a tombstone for one TTL (404 or 410 from then on) and its slot freed.

        Its log stays for `REFRESH_FRACTION` of a TTL more, until the reaper erases it: a process that
        still holds the env live only re-reads the slot that often, and until then it must find its next
        claim taken (by the end entry) rather than free, or it would write into a deleted log."""
        self.live.drop(meta.env_id)
        tombstone = dumps_bytes({"gone": why, "at": self.store.clock()})
        await self.store.put(meta_key(meta.env_id), tombstone, ttl_s=self.limits.ttl_s)
        await self.slots.release(meta.slot, meta.env_id)

    async def _erase(self, env_ids: list[str]) -> None:
        """Delete ended envs' keys (their tombstones expire on their own), found in one scan of every env's
        keys: a scan per env costs the whole store on the memory backend, which made a pass quadratic."""
        if not env_ids:
            return
        ended = set(env_ids)
        keys = []
        for key in await self.store.scan(ENV_KEYS):
            env_id, _, rest = key.removeprefix(ENV_KEYS).partition("/")
            if env_id in ended and rest != "meta":
                keys.append(key)
        await self.store.delete([*keys, *(marker_key(env_id) for env_id in env_ids)])

    # --- maintenance ----------------------------------------------------------------------------------

    async def maintain(self) -> dict[str, int]:
        """One pass of the reaper: idle live envs out of memory, expired entries out of the store and,
        where scanning is cheap (memory, sqlite), envs whose slot lapsed retired and ended envs erased.
        On modal-dict the records of ended envs are left to Modal's own expiry (7 days without access)."""
        idle = self.live.idle_since(self.monotonic() - self.limits.ttl_s)
        for env_id in idle:
            self.live.evict(env_id)
        purged = await self.store.purge()
        reaped, ended = 0, []
        if self.store.cheap_scan:
            now, grace = self.store.clock(), self.limits.ttl_s * REFRESH_FRACTION
            env_ids = [key.partition("/")[2] for key in await self.store.scan("envs/")]
            markers = await self.store.get_many([marker_key(env_id) for env_id in env_ids])
            metas = await self.store.get_many([meta_key(env_id) for env_id in env_ids])
            for env_id, marker, raw in zip(env_ids, markers, metas, strict=True):
                value = loads(raw) if raw is not None else None
                if value is None or "gone" in value:  # ended (or never finished being created)
                    since = value["at"] if value is not None else loads(marker or b"{}").get("at", 0.0)
                    if now - float(since) > grace:
                        ended.append(env_id)
                    continue
                meta = EnvMeta.decode(value)
                if await self.slots.held_since(meta.slot, env_id) is None:
                    await self._retire(meta, EXPIRED)
                    reaped += 1
            await self._erase(ended)
        self.counters["reaped"] += reaped
        return {"evicted": len(idle), "purged": purged, "reaped": reaped}

    def stats(self) -> dict[str, Any]:
        return {"backend": self.store.name, "live": len(self.live), "live_limit": self.limits.max_live, **self.counters}

    # --- helpers --------------------------------------------------------------------------------------

    def _fresh(self, seed: int, meta: EnvMeta) -> Game:
        return Game(self.worlds.world(seed, meta.area, meta.length), image_size=meta.image_size)

    def _load(self, checkpoint: bytes, meta: EnvMeta) -> tuple[Game, Episode]:
        game, extra = load_game(checkpoint, self.worlds, meta.image_size)
        return game, Episode.from_extra(extra)

    async def _copy(self, live: LiveEnv) -> tuple[EnvSpec, bytes]:
        """The env's current spec (its current seed) and a checkpoint of its current state."""
        checkpoint = await self.offload(lambda: dump_game(live.game, live.episode.as_extra()))
        return live.meta.spec(live.seed), checkpoint

    def _live(self, meta: EnvMeta, game: Game, episode: Episode, slot_at: float, head: int = 0) -> LiveEnv:
        return LiveEnv(meta, game, episode, head, slot_at, RateBucket(self.limits.rate_per_s))

    def _view(
        self,
        live: LiveEnv,
        observation: Observation,
        *,
        outcome: DecisionOutcome | None = None,
        plan: ActionPlan | None = None,
        episode_over: bool = False,
    ) -> EnvView:
        return view_of(
            live.env_id, live.game, live.episode, observation, outcome, plan, episode_over, self.task_id(live)
        )

    def task_id(self, live: LiveEnv) -> str | None:
        """The task id of the env's current world: its seed's, when the env has the tasks' area."""
        if self.tasks is None or live.meta.area != self.tasks.area:
            return None
        try:
            return self.tasks.task_of_seed(live.seed).task_id
        except InvalidRequest:
            return None
