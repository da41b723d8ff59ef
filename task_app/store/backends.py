"""`TASKAPP_STATE_BACKEND`: `memory` (default), `sqlite:PATH` or `modal-dict:NAME`, opened in the lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from .base import StateStore
from .memory import MemoryStore
from .modal_dict import ModalDictStore
from .sqlite import SqliteStore


@asynccontextmanager
async def open_store(spec: str) -> AsyncIterator[StateStore]:
    kind, _, location = spec.partition(":")
    store: StateStore
    if kind == "memory":
        store = MemoryStore()
    elif kind == "sqlite":
        store = await SqliteStore(location).open()
    elif kind == "modal-dict":
        store = ModalDictStore.from_name(location)
    else:
        raise ValueError(f"unknown state backend {spec!r}; use memory, sqlite:PATH or modal-dict:NAME")
    try:
        yield store
    finally:
        await store.close()
