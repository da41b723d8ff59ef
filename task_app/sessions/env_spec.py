"""What an env session is made of (`EnvSpec`) and the limits sessions run under (`SessionLimits`).

A create request's `config` is the old system's free-form dict (docs/compatibility.md, "Env-session
routes"); the keys we read are typed here, everything else is ignored (as the old system did): `area`,
`length` (crafter steps per episode), `image_size` (a frame in every observation, in pixels; none when
absent). `difficulty` / `world_config` are accepted and have no effect, as in the old system (crafter
has one world generator).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from ..core.errors import InvalidRequest, UnknownName
from ..core.settings import Settings
from ..core.tasks import Tasks, check_area
from ..game.bounds import MAX_AREA_SIDE, MAX_EPISODE_LENGTH, MAX_IMAGE_SIZE, MIN_AREA_SIDE, MIN_IMAGE_SIZE, valid_area

ENV_NAMES = {"crafter": "crafter", "crafterclassic": "crafter"}


class SessionConfig(BaseModel):
    model_config = ConfigDict(extra="allow")

    area: tuple[StrictInt, StrictInt] | None = None
    length: StrictInt | None = Field(default=None, ge=1, le=MAX_EPISODE_LENGTH)
    image_size: StrictInt | None = Field(default=None, ge=MIN_IMAGE_SIZE, le=MAX_IMAGE_SIZE)


@dataclass(frozen=True, slots=True)
class EnvSpec:
    env_name: str
    seed: int
    area: tuple[int, int]
    length: int
    image_size: int | None
    rl_run_id: str | None

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> EnvSpec:
        fields = {name: value[name] for name in cls.__dataclass_fields__}
        return cls(**{**fields, "area": (int(fields["area"][0]), int(fields["area"][1]))})


@dataclass(frozen=True, slots=True)
class SessionLimits:
    max_live: int = 256
    max_envs: int = 10_000
    max_steps: int = 20_000
    max_snapshots: int = 16
    max_children: int = 64
    ttl_s: float = 3600.0
    rate_per_s: float = 1000.0
    checkpoint_every: int = 50
    max_actions: int = 8
    max_seed: int = 2**31 - 1

    @classmethod
    def from_settings(cls, settings: Settings) -> SessionLimits:
        return cls(
            max_live=settings.sessions_max_live,
            max_envs=settings.sessions_max_envs,
            max_steps=settings.sessions_max_steps,
            max_snapshots=settings.sessions_max_snapshots,
            max_children=settings.sessions_max_children,
            ttl_s=settings.sessions_ttl_s,
            rate_per_s=settings.sessions_rate_per_s,
            checkpoint_every=settings.sessions_checkpoint_every,
            max_actions=settings.max_actions_per_decision,
            max_seed=settings.max_seed,
        )


def env_name(raw: object) -> str:
    name = ENV_NAMES.get(raw.strip().lower()) if isinstance(raw, str) else None
    if name is None:
        raise UnknownName(
            f"unknown env_name {raw!r}; this app serves 'crafter' (or 'CrafterClassic')", code="unknown_env"
        )
    return name


def check_seed(seed: int, limits: SessionLimits) -> int:
    if not 0 <= seed <= limits.max_seed:
        raise InvalidRequest(f"seed must be in [0, {limits.max_seed}]", code="seed_out_of_range")
    return seed


def build_spec(
    raw_name: object,
    config: dict[str, Any],
    seed: int | None,
    rl_run_id: str | None,
    settings: Settings,
    task_id: str | None = None,
) -> EnvSpec:
    """Validate a create request. The world is named by `seed`, by `task_id` or by both (422 when they
    disagree); naming neither draws a random train world (and the response says which)."""
    name = env_name(raw_name)
    try:
        parsed = SessionConfig.model_validate(config)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in ("config", *first["loc"]))
        raise InvalidRequest(f"{where}: {first['msg']}", code="invalid_env_config") from exc
    area = parsed.area or settings.area
    if not valid_area(area):
        raise InvalidRequest(
            f"config.area sides must be in [{MIN_AREA_SIDE}, {MAX_AREA_SIDE}]", code="invalid_env_config"
        )
    tasks = Tasks(settings)
    task = tasks.resolve(task_id, seed)
    check_area(task, (int(area[0]), int(area[1])))
    limits = SessionLimits.from_settings(settings)
    if task is not None:
        chosen = task.seed
    else:
        chosen = tasks.random_train_seed() if seed is None else check_seed(seed, limits)
    return EnvSpec(
        env_name=name,
        seed=chosen,
        area=(int(area[0]), int(area[1])),
        length=parsed.length or settings.episode_length,
        image_size=parsed.image_size,
        rl_run_id=rl_run_id,
    )
