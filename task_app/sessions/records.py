"""The record of an env session in the state store: its keys and the JSON values under them.

    envs/<id>                 marker, for the reaper's scan (value: the slot index)
    env/<id>/meta             EnvMeta, written once at creation; a tombstone {"gone": why} once it ended
    env/<id>/log/<n>          the n-th step / reset / end, claimed with put_if_absent (the ordering)
    env/<id>/ck/<j>           checkpoint: the game after log entries [0, j*K) (ck/0 only for restored envs)
    env/<id>/ck-hint          the latest checkpoint index j (a hint: rebuilds probe forward from it)
    env/<id>/snap-slot/<k>    one of the env's snapshot slots (TTL), holding a snapshot id
    slots/<i>                 one of TASKAPP_SESSIONS_MAX_ENVS env slots (TTL, refreshed while in use)
    snap/<sid>                a snapshot: the env's spec and a checkpoint (TTL)
    tool-sessions/<id>        a tool session: the env it plays now (`tools.py`; TTL)
    openenv/tokens/<digest>   an OpenEnv token, and /session the token's own tool session (`openenv_tokens.py`)

Ids come from `secrets.token_urlsafe(16)` (128 bits); a client-sent id that does not have that form
cannot name anything and is answered as not found before any key is built from it.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import asdict, dataclass
from typing import Any, Literal

from ..core.errors import Gone, NotFound, TaskAppError
from ..core.json_codec import dumps_bytes, loads
from .env_spec import EnvSpec

_ID = re.compile(r"^[A-Za-z0-9_-]{16,64}$")
STEP, RESET, END = "step", "reset", "end"
TERMINATED, EXPIRED = "terminated", "expired"
Origin = Literal["seed", "checkpoint"]


def new_id() -> str:
    return secrets.token_urlsafe(16)


def valid_id(value: object) -> bool:
    return isinstance(value, str) and _ID.match(value) is not None


def marker_key(env_id: str) -> str:
    return f"envs/{env_id}"


def meta_key(env_id: str) -> str:
    return f"env/{env_id}/meta"


def log_key(env_id: str, index: int) -> str:
    return f"env/{env_id}/log/{index:09d}"


def checkpoint_key(env_id: str, index: int) -> str:
    return f"env/{env_id}/ck/{index:07d}"


def hint_key(env_id: str) -> str:
    return f"env/{env_id}/ck-hint"


def snapshot_slot_key(env_id: str, index: int) -> str:
    return f"env/{env_id}/snap-slot/{index:04d}"


ENV_KEYS = "env/"  # the prefix of every env's keys: env/<env_id>/...


def env_prefix(env_id: str) -> str:
    return f"{ENV_KEYS}{env_id}/"


def slot_key(index: int) -> str:
    return f"slots/{index:07d}"


def snapshot_key(snapshot_id: str) -> str:
    return f"snap/{snapshot_id}"


@dataclass(frozen=True, slots=True)
class EnvMeta:
    """What never changes about an env: written once, before anyone can know its id."""

    env_id: str
    env_name: str
    seed: int  # the seed at creation (a reset may change the current one; checkpoints carry it)
    area: tuple[int, int]
    length: int
    image_size: int | None
    rl_run_id: str | None
    slot: int
    origin: Origin  # "seed": log entry 0 starts from the seed's fresh world; "checkpoint": from ck/0
    parent: str | None  # the env or snapshot it was copied from
    created_at: float

    @classmethod
    def new(cls, spec: EnvSpec, env_id: str, slot: int, origin: Origin, parent: str | None, now: float) -> EnvMeta:
        return cls(
            env_id=env_id,
            env_name=spec.env_name,
            seed=spec.seed,
            area=spec.area,
            length=spec.length,
            image_size=spec.image_size,
            rl_run_id=spec.rl_run_id,
            slot=slot,
            origin=origin,
            parent=parent,
            created_at=now,
        )

    def spec(self, seed: int) -> EnvSpec:
        """The spec of a copy of this env whose current seed is `seed`."""
        return EnvSpec(self.env_name, seed, self.area, self.length, self.image_size, self.rl_run_id)

    def encode(self) -> bytes:
        return dumps_bytes({"v": 1, **asdict(self)})

    @classmethod
    def decode(cls, value: dict[str, Any]) -> EnvMeta:
        fields = {name: value[name] for name in cls.__dataclass_fields__}
        fields["area"] = (int(fields["area"][0]), int(fields["area"][1]))
        return cls(**fields)


def not_found(env_id: str) -> NotFound:
    return NotFound(f"env {env_id!r} not found", code="env_not_found", env_id=env_id)


def expired(env_id: str) -> Gone:
    return Gone(f"env {env_id!r} expired after being idle", code="env_expired", env_id=env_id)


def ended(env_id: str, why: str) -> TaskAppError:
    """What a request for an env that ended gets: 410 once it expired, 404 once it was terminated."""
    if why == EXPIRED:
        return expired(env_id)
    return NotFound(f"env {env_id!r} was terminated", code="env_not_found", env_id=env_id)


def decode_meta(env_id: str, raw: bytes | None) -> EnvMeta:
    """The env's meta, or the error its absence or tombstone means."""
    if raw is None:
        raise not_found(env_id)
    value = loads(raw)
    if "gone" in value:
        raise ended(env_id, str(value["gone"]))
    return EnvMeta.decode(value)
