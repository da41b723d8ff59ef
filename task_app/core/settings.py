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
        use_attribute_docstrings=True,
    )

    # --- keys (never logged, never returned) -------------------------------------------------
    environment_api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("ENVIRONMENT_API_KEY", "DEV_ENVIRONMENT_API_KEY", "environment_api_key"),
    )
    """The key callers must present (`X-API-Key`, `X-API-Keys` or `Authorization: Bearer`); without it the
    protected routes answer 503. `DEV_ENVIRONMENT_API_KEY` is read when it is unset."""
    environment_api_key_aliases: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list,
        validation_alias=AliasChoices("ENVIRONMENT_API_KEY_ALIASES", "environment_api_key_aliases"),
    )
    """More accepted keys, comma-separated (for rotating the key)."""
    openai_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("OPENAI_API_KEY", "openai_api_key")
    )
    """OpenAI's key, for `/proxy/v1/chat/completions` and rollouts with `provider: "openai"`."""
    groq_api_key: SecretStr | None = Field(default=None, validation_alias=AliasChoices("GROQ_API_KEY", "groq_api_key"))
    """Groq's key, for `/proxy/groq/v1/chat/completions` and rollouts with `provider: "groq"`."""

    # --- serving -------------------------------------------------------------------------------
    host: str = "127.0.0.1"
    """The address `task-app serve` listens on."""
    port: int = Field(default=8001, ge=0, le=65535)
    """The port `task-app serve` listens on."""
    service_id: str = "grpo-crafter-task-app"
    """The service name `/` and `/health` report."""
    max_concurrent_rollouts: int = Field(default=256, ge=1, le=100_000)
    """Rollouts in flight per process; one more is a 429 with `Retry-After`."""
    # Crafter work holds the GIL, so threads add no parallelism, only contention with the event loop:
    # 2 lets one world generation run beside the steps (more threads cost throughput: docs/performance.md).
    worker_threads: int = Field(default=2, ge=1, le=256)
    """Threads for crafter work that leaves the event loop (world generation, frames, long rollouts' ends)."""
    # Python runs on one core per process: `task-app serve` starts this many app processes on one
    # port (uvicorn's workers) to use the others. Each keeps its own world cache, trace writer, limits
    # and metrics; env sessions and runs must be shared, so more than 1 needs a state store other
    # than memory (docs/fleet.md; docs/performance.md has one and two processes).
    processes: int = Field(default=1, ge=1, le=64)
    """App processes `task-app serve` runs on its one port; more than 1 needs a shared `TASKAPP_STATE_BACKEND`."""
    max_body_bytes: int = Field(default=1_048_576, ge=1024)
    """Largest request body; a larger one is a 413. It also bounds an `ops` list."""
    gzip_min_bytes: int = Field(default=8192, ge=0)
    """Smallest response body compressed for a client that accepts gzip; env answers (a few KB) go as they
    are, rollout answers and exports are compressed (docs/decisions/compression.md)."""
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Origins allowed by CORS, comma-separated; CORS stays off when empty."""
    math_alias_enabled: bool = True
    """Remap the old system's `math*` env and policy names to Crafter."""
    step_fast_path: bool = True
    """Answer well-formed env-session steps (`/step`, `/env/step`) beside FastAPI's routing, as the route
    would, for less CPU a step (docs/decisions/step-path.md); off: every request goes through FastAPI."""
    loop_lag_probe_s: float = Field(default=0.0, ge=0, le=60)
    """When above 0, measure the event loop's lag at this interval and report it in `/health`."""

    # --- rollouts ------------------------------------------------------------------------------
    max_decisions: int = Field(default=10_000, ge=1)
    """Largest `policy.config.max_llm_calls` a rollout may ask for."""
    max_time_s: float = Field(default=3600.0, gt=0)
    """Upper bound of a rollout's `safety.max_time_s`."""
    max_actions_per_decision: int = Field(default=8, ge=1, le=64)
    """Actions one `interact_many` call may execute; the rest are rejected."""
    unusable_answers_limit: int = Field(default=3, ge=1)
    """Unusable model answers in a row before a rollout stops with `policy_unusable`."""
    run_registry_size: int = Field(default=4096, ge=16)
    """Finished runs per process whose run_id (and response) the state store keeps."""
    history_length: int = Field(default=5, ge=0, le=50)
    """Earlier decisions summarised for the model (`history: "summary"`)."""

    # --- the world -----------------------------------------------------------------------------
    area: Annotated[tuple[int, int], NoDecode] = (64, 64)
    """Default world size, `W,H`."""
    episode_length: int = Field(default=10_000, ge=1)
    """Default episode length, in crafter steps."""
    default_seed: int = Field(default=42, ge=0, le=MAX_SEED)
    """The seed `/info` advertises as the dataset's default."""
    max_seed: int = Field(default=MAX_SEED, ge=0, le=MAX_SEED)
    """Largest seed accepted; seeds outside `[0, max]` are a 422."""
    world_cache_size: int = Field(default=512, ge=0)
    """Generated worlds kept for rebuilding a repeated seed (~8 KB each)."""
    traits_cache_size: int = Field(default=4096, ge=0)
    """Per-seed world traits kept for `/task_info`."""
    task_info_max_seeds: int = Field(default=256, ge=1)
    """Seeds one `/task_info` call may ask for."""
    warm_up: bool = True
    """Compile the world generator's kernels at start-up rather than at the first new world."""

    # --- inference -----------------------------------------------------------------------------
    inference_connect_timeout_s: float = Field(default=10.0, gt=0)
    """Connect timeout of a model call."""
    inference_read_timeout_s: float = Field(default=120.0, gt=0)
    """Read timeout of a model call; one attempt (or one proxied stream) gets at most connect + read. It is
    also how long a request held by a paused server (a weight update) may wait: set it above your update's time."""
    inference_max_attempts: int = Field(default=4, ge=1, le=20)
    """Attempts per model call (connection errors, timeouts, 429, 5xx), all inside the rollout's deadline."""
    inference_abort_retries: int = Field(default=8, ge=0, le=100)
    """Answers with `finish_reason: "abort"` (vLLM's `pause_generation` during a weight update) a decision
    sends again, after the backoff, before it fails; each is counted in the step's `aborted_answers`."""
    inference_backoff_s: float = Field(default=0.5, ge=0)
    """First backoff between attempts (exponential, with jitter)."""
    inference_backoff_max_s: float = Field(default=8.0, ge=0)
    """Longest backoff between attempts; also caps a server's `Retry-After`."""
    inference_max_response_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    """Largest model answer read; a longer one is unusable (a proxied stream ends with an error event)."""
    inference_max_connections: int | None = Field(default=None, ge=1)
    """Connections open at once to model servers, vendors and callback receivers (unset: twice
    `max_concurrent_rollouts`, so the pool follows the rollout cap)."""
    inference_allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """When set, the only hosts an `inference_url` or `callback_url` may name (comma-separated), against SSRF."""
    openai_base_url: str = "https://api.openai.com/v1"
    """Where the OpenAI proxy and `provider: "openai"` go."""
    groq_base_url: str = "https://api.groq.com/openai/v1"
    """Where the Groq proxy and `provider: "groq"` go."""

    # --- tracing -------------------------------------------------------------------------------
    tracing_enabled: bool = True
    """Store every rollout's trace in SQLite."""
    traces_db: Path = Path("./traces/task_app.db")
    """The trace database."""
    sft_output_dir: Path | None = None
    """When set, also write one SFT JSONL file per rollout here."""
    trace_queue_size: int = Field(default=1024, ge=1)
    """Rollouts waiting for the trace writer."""
    traces_cache_mb: int = Field(default=64, ge=1, le=65_536)
    """SQLite page cache of the trace store, in MB."""
    rubrics_dir: Path | None = None
    """A folder with the two rubric files to read instead of the packaged ones (`task_app/data/rubrics/`)."""

    # --- env sessions (the step API, OpenEnv) and the state store ------------------------------
    state_backend: str = Field(default="memory", pattern=STATE_BACKEND_PATTERN)
    """Where env sessions and the run registry live: `memory` (one process), `sqlite:PATH` (processes on one
    machine share the file) or `modal-dict:NAME` (`modal_app.py` sets it)."""
    # A trainer keeps ~1,000 sessions in flight per process (docs/modal.md#sizing-sessions): all live, none rebuilt.
    sessions_max_live: int = Field(default=2048, ge=1, le=100_000)
    """Live envs per process (an evicted env is rebuilt from the store); 429 when all are in use."""
    sessions_max_envs: int = Field(default=10_000, ge=1, le=1_000_000)
    """Envs in the state store, fleet-wide; one more is a 429."""
    sessions_max_steps: int = Field(default=20_000, ge=1)
    """Step and reset calls over an env's life; beyond it 409 `env_step_limit`."""
    sessions_max_snapshots: int = Field(default=16, ge=1, le=1000)
    """Unexpired snapshots per env; beyond it 429 until the oldest expires."""
    sessions_max_children: int = Field(default=64, ge=1, le=1024)
    """New envs one `/branch` call may create."""
    sessions_ttl_s: float = Field(default=3600.0, ge=1)
    """Idle seconds before an env expires (then 410); also a snapshot's lifetime."""
    sessions_rate_per_s: float = Field(default=1000.0, gt=0)
    """Requests per second per env, per process; beyond it 429."""
    sessions_checkpoint_every: int = Field(default=50, ge=1)
    """A checkpoint every N log entries, so a rebuild replays at most N step calls."""
    openenv_max_sessions: int = Field(default=1024, ge=1)
    """OpenEnv WebSocket sessions per process; beyond it the `CAPACITY_REACHED` reply."""
    openenv_token_ttl_s: float = Field(default=3600.0, ge=1)
    """Longest lifetime of an OpenEnv session token."""
    # --- the standard doors for agents and trainers: MCP at /mcp, the Open Reward Standard on its own port --
    mcp_max_in_flight: int = Field(default=256, ge=1, le=100_000)
    """MCP requests served at once per process; beyond it 429."""
    ors_port: int | None = Field(default=None, ge=0, le=65535)
    """`task-app serve`: also serve the Open Reward Standard on this port."""

    # --- runs across the fleet (the run registry in the state store), async submission ----------
    runs_ttl_s: float = Field(default=86_400.0, ge=60)
    """How long a finished run_id is remembered: its status, and a resubmission's replay or 409 `run_id_used`."""
    runs_result_ttl_s: float = Field(default=3600.0, ge=10)
    """How long a finished run's response is kept (then 410 `result_expired`)."""
    runs_result_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    """Bytes of stored responses per process, oldest deleted first."""
    runs_heartbeat_s: float = Field(default=2.0, gt=0, le=60)
    """A process's heartbeat interval (its runs and their progress, one store write)."""
    runs_lost_after_s: float = Field(default=30.0, gt=0)
    """A run is `lost` once its process has been silent this long (at least 3 heartbeats)."""
    runs_abort_poll_s: float = Field(default=0.25, gt=0, le=10)
    """How often a process reads its bell for aborts asked for on other processes."""
    max_queued_rollouts: int = Field(default=4096, ge=1)
    """Accepted rollouts waiting for a slot, per process; beyond it 429 `queue_full`."""
    max_batch_rollouts: int = Field(default=256, ge=1, le=10_000)
    """Rollouts per `POST /rollouts` call."""
    callback_max_attempts: int = Field(default=5, ge=1, le=20)
    """Attempts to deliver a `callback_url`."""
    callback_backoff_s: float = Field(default=1.0, ge=0, le=60)
    """First backoff between callback attempts (doubling, at most 30 s)."""
    callback_timeout_s: float = Field(default=30.0, gt=0)
    """Timeout of one callback attempt."""
    rollout_log: bool = Field(default=False)
    """One structured JSON line per finished rollout on stderr."""

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
