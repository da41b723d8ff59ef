"""task-app-client: a light client for the Crafter task app (docs/client.md).

Client / AsyncClient      one connection pool to one app: env sessions, rollouts, runs, task info
Env / AsyncEnv            an env session (a context manager that terminates it)
rollout_request()         the common rollout request; RolloutRequest for every field
Timeout, RetryPolicy      the configuration values
*Error                    one hierarchy (task_app_client._errors); each carries the server's code
"""

from ._async_client import AsyncClient, AsyncEnv, EnvOpening
from ._client import Client, Env
from ._config import RetryPolicy, Timeout
from ._errors import (
    APIConnectionError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    GoneError,
    InternalServerError,
    NotFoundError,
    RateLimitError,
    RunNotFinished,
    ServiceUnavailableError,
    TaskAppClientError,
)
from ._requests import EnvSpec, PolicySpec, RolloutRequest, rollout_request
from ._results import (
    AbortResult,
    AppInfo,
    EnvInfo,
    EnvState,
    Observation,
    Rejection,
    RolloutMetrics,
    RolloutResult,
    RolloutStep,
    RunStatus,
    Snapshot,
    StepInfo,
    StepResult,
    SubmittedRun,
    TaskInfo,
    TaskSet,
    TaskSplit,
    Trajectory,
)
from ._version import VERSION as _VERSION

__version__ = _VERSION

__all__ = [
    "APIConnectionError",
    "APIResponseValidationError",
    "APIStatusError",
    "APITimeoutError",
    "AbortResult",
    "AppInfo",
    "AsyncClient",
    "AsyncEnv",
    "AuthenticationError",
    "BadRequestError",
    "Client",
    "ConflictError",
    "Env",
    "EnvInfo",
    "EnvOpening",
    "EnvSpec",
    "EnvState",
    "GoneError",
    "InternalServerError",
    "NotFoundError",
    "Observation",
    "PolicySpec",
    "RateLimitError",
    "Rejection",
    "RetryPolicy",
    "RolloutMetrics",
    "RolloutRequest",
    "RolloutResult",
    "RolloutStep",
    "RunNotFinished",
    "RunStatus",
    "ServiceUnavailableError",
    "Snapshot",
    "StepInfo",
    "StepResult",
    "SubmittedRun",
    "TaskAppClientError",
    "TaskInfo",
    "TaskSet",
    "TaskSplit",
    "Timeout",
    "Trajectory",
    "rollout_request",
]
