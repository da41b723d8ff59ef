"""The one place that reads the environment.

`Settings()` reads environment variables (and `.env` when the CLI asks for it); tests build
`Settings(field=value)` directly. Every limit the service enforces is a bounded field here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

MAX_SEED = 2**31 - 1
STATE_BACKEND_PATTERN = r"^(memory|sqlite:.+|modal-dict:[A-Za-z0-9._-]{1,64})$"


def _csv(value: object) -> object:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TASKAPP_",
        env_ignore_empty=True,
        extra="ignore",
        populate_by_name=True,
        frozen=True,
    )

    # --- keys (never logged, never returned) -------------------------------------------------
    environment_api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("ENVIRONMENT_API_KEY", "DEV_ENVIRONMENT_API_KEY", "environment_api_key"),
    )
    environment_api_key_aliases: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list,
        validation_alias=AliasChoices("ENVIRONMENT_API_KEY_ALIASES", "environment_api_key_aliases"),
    )
    openai_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("OPENAI_API_KEY", "openai_api_key")
    )
    groq_api_key: SecretStr | None = Field(default=None, validation_alias=AliasChoices("GROQ_API_KEY", "groq_api_key"))

    # --- serving -------------------------------------------------------------------------------
    host: str = "127.0.0.1"
    port: int = Field(default=8001, ge=0, le=65535)
    service_id: str = "grpo-crafter-task-app"
    max_concurrent_rollouts: int = Field(default=256, ge=1, le=100_000)
    # Crafter work holds the GIL, so threads add no parallelism, only contention with the event loop:
    # 2 lets one world generation run beside the steps (benchmarks/ B3: 8 threads cost ~10 % throughput).
    worker_threads: int = Field(default=2, ge=1, le=256)
    # Python runs on one core per process: `task-app serve` starts this many app processes on one
    # port (uvicorn's workers) to use the others. Each keeps its own world cache, trace writer, limits
    # and metrics; env sessions and runs must be shared, so more than 1 needs a state store other
    # than memory (benchmarks/ B3 and B8 with 1 and 2 processes).
    processes: int = Field(default=1, ge=1, le=64)
    max_body_bytes: int = Field(default=1_048_576, ge=1024)
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    math_alias_enabled: bool = True
    loop_lag_probe_s: float = Field(
        default=0.0, ge=0, le=60, description="event-loop lag probe interval, reported in /health (0 = off)"
    )

    # --- rollouts ------------------------------------------------------------------------------
    max_decisions: int = Field(default=10_000, ge=1, description="largest max_llm_calls accepted")
    max_time_s: float = Field(default=3600.0, gt=0, description="upper bound on safety.max_time_s")
    max_actions_per_decision: int = Field(default=8, ge=1, le=64)
    unusable_answers_limit: int = Field(default=3, ge=1)
    run_registry_size: int = Field(
        default=4096, ge=16, description="finished runs per process whose run_id and response stay in the state store"
    )
    history_length: int = Field(default=5, ge=0, le=50)

    # --- the world -----------------------------------------------------------------------------
    area: Annotated[tuple[int, int], NoDecode] = (64, 64)
    episode_length: int = Field(default=10_000, ge=1)
    default_seed: int = Field(default=42, ge=0, le=MAX_SEED)
    max_seed: int = Field(default=MAX_SEED, ge=0, le=MAX_SEED)
    world_cache_size: int = Field(default=512, ge=0)
    traits_cache_size: int = Field(default=4096, ge=0)
    task_info_max_seeds: int = Field(default=256, ge=1)
    warm_up: bool = True

    # --- inference -----------------------------------------------------------------------------
    inference_connect_timeout_s: float = Field(default=10.0, gt=0)
    inference_read_timeout_s: float = Field(default=120.0, gt=0)
    inference_max_attempts: int = Field(default=4, ge=1, le=20)
    inference_backoff_s: float = Field(default=0.5, ge=0)
    inference_backoff_max_s: float = Field(default=8.0, ge=0)
    inference_max_response_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    inference_max_connections: int | None = Field(
        default=None,
        ge=1,
        description="connections open at once to model servers, vendors and callback receivers "
        "(default: twice max_concurrent_rollouts)",
    )
    inference_allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    openai_base_url: str = "https://api.openai.com/v1"
    groq_base_url: str = "https://api.groq.com/openai/v1"

    # --- tracing -------------------------------------------------------------------------------
    tracing_enabled: bool = True
    traces_db: Path = Path("./traces/task_app.db")
    sft_output_dir: Path | None = None
    trace_queue_size: int = Field(default=1024, ge=1)
    traces_cache_mb: int = Field(default=64, ge=1, le=65_536, description="SQLite page cache of the trace store")
    rubrics_dir: Path | None = None

    # --- env sessions (the step API, OpenEnv) and the state store ------------------------------
    state_backend: str = Field(
        default="memory", pattern=STATE_BACKEND_PATTERN, description="memory | sqlite:PATH | modal-dict:NAME"
    )
    sessions_max_live: int = Field(default=256, ge=1, le=100_000, description="live envs per process")
    sessions_max_envs: int = Field(default=10_000, ge=1, le=1_000_000, description="envs in the state store")
    sessions_max_steps: int = Field(default=20_000, ge=1, description="step and reset calls per env")
    sessions_max_snapshots: int = Field(default=16, ge=1, le=1000, description="unexpired snapshots per env")
    sessions_max_children: int = Field(default=64, ge=1, le=1024, description="new envs per /branch call")
    sessions_ttl_s: float = Field(default=3600.0, ge=1, description="idle time to live of an env; snapshot lifetime")
    sessions_rate_per_s: float = Field(default=1000.0, gt=0, description="requests per second per env, per process")
    sessions_checkpoint_every: int = Field(default=50, ge=1, description="a checkpoint every N log entries")
    openenv_max_sessions: int = Field(default=64, ge=1, description="OpenEnv WebSocket sessions per process")
    openenv_token_ttl_s: float = Field(default=3600.0, ge=1, description="longest OpenEnv session-token lifetime")

    # --- runs across the fleet (the run registry in the state store), async submission ----------
    runs_ttl_s: float = Field(default=86_400.0, ge=60, description="how long a finished run_id is remembered")
    runs_result_ttl_s: float = Field(default=3600.0, ge=10, description="how long a finished run's response is kept")
    runs_result_bytes: int = Field(
        default=64 * 1024 * 1024, ge=0, description="bytes of stored responses per process, oldest deleted first"
    )
    runs_heartbeat_s: float = Field(default=2.0, gt=0, le=60, description="interval of a process's heartbeat")
    runs_lost_after_s: float = Field(default=30.0, gt=0, description="a run is lost once its process is silent so long")
    runs_abort_poll_s: float = Field(default=0.25, gt=0, le=10, description="how often a process looks for aborts")
    max_queued_rollouts: int = Field(
        default=4096, ge=1, description="accepted rollouts waiting for a slot, per process"
    )
    max_batch_rollouts: int = Field(default=256, ge=1, le=10_000, description="rollouts per POST /rollouts")
    callback_max_attempts: int = Field(default=5, ge=1, le=20)
    callback_backoff_s: float = Field(default=1.0, ge=0, le=60)
    callback_timeout_s: float = Field(default=30.0, gt=0)
    rollout_log: bool = Field(default=False, description="one JSON line per finished rollout on stderr")

    @field_validator("environment_api_key_aliases", "cors_origins", "inference_allowed_hosts", mode="before")
    @classmethod
    def _split_csv(cls, value: object) -> object:
        return _csv(value)

    @field_validator("area", mode="before")
    @classmethod
    def _parse_area(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(int(part) for part in value.split(","))
        return value

    @model_validator(mode="after")
    def _processes_share_state(self) -> Settings:
        if self.processes > 1 and self.state_backend == "memory":
            raise ValueError(
                "TASKAPP_PROCESSES > 1 needs a state store the processes share (TASKAPP_STATE_BACKEND="
                "sqlite:PATH or modal-dict:NAME): with memory an env created on one process is unknown to the others"
            )
        return self

    @model_validator(mode="after")
    def _lost_after_several_beats(self) -> Settings:
        if self.runs_lost_after_s < 3 * self.runs_heartbeat_s:
            raise ValueError("TASKAPP_RUNS_LOST_AFTER_S must be at least 3 x TASKAPP_RUNS_HEARTBEAT_S")
        return self

    @property
    def outbound_max_connections(self) -> int:
        """The outbound pool's size: the setting, else one connection per rollout's model call and as
        many again for the vendor proxies and the callbacks (the pool opens them only as needed)."""
        return self.inference_max_connections or 2 * self.max_concurrent_rollouts

    @property
    def api_keys(self) -> list[str]:
        """Every accepted key: the primary plus the aliases."""
        keys = [self.environment_api_key] if self.environment_api_key else []
        keys.extend(self.environment_api_key_aliases)
        return [key.get_secret_value() for key in keys if key.get_secret_value()]
