"""Shared fixtures: a clean environment for every test and one world factory per session."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from task_app.crafter import WorldFactory

_OWN_VARIABLES = (
    "ENVIRONMENT_API_KEY",
    "DEV_ENVIRONMENT_API_KEY",
    "ENVIRONMENT_API_KEY_ALIASES",
    "OPENAI_API_KEY",
    "GROQ_API_KEY",
)


@pytest.fixture(autouse=True)
def clean_environ() -> Iterator[None]:
    """Tests never see the developer's keys or TASKAPP_* settings."""
    saved = dict(os.environ)
    for name in list(os.environ):
        if name.startswith(("TASKAPP_", "MODAL_")) or name in _OWN_VARIABLES:
            del os.environ[name]
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session")
def worlds() -> WorldFactory:
    factory = WorldFactory(cache_size=64)
    factory.warm_up()
    return factory
