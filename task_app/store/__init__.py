"""The state store: where state that a later request may need lives, outside any one process."""

from .backends import open_store
from .base import StateStore, StoreUnavailable

__all__ = ["StateStore", "StoreUnavailable", "open_store"]
