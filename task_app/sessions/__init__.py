"""Environment sessions: envs stepped by the client, their record in the state store, snapshots, OpenEnv."""

from .env_spec import EnvSpec, SessionLimits, build_spec
from .manager import EnvSessions, EnvView, SnapshotInfo

__all__ = ["EnvSessions", "EnvSpec", "EnvView", "SessionLimits", "SnapshotInfo", "build_spec"]
