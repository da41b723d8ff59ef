"""The keys tests configure, and the checks that no piece of one is ever shown: in a response (body or
headers), a log record (the session's `KEY_GUARD`, installed by conftest.py) or a child's log."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

# Mixed case and letters outside [0-9a-f]: no 4-character piece of these occurs in uuids, hex ids or prose.
TEST_KEY = "tk-Qz7WxJvKpLmYrNsT"
ALIAS_KEY = "ak-HgFzXqWvBnMjKyPu"
SECRETS = (TEST_KEY, ALIAS_KEY)
FRAGMENT = 4
OPENAI_KEY = "sk-proj-Vw9QeRtYuPzXcMnB"
GROQ_KEY = "gsk_Lk8JhGfDsAzXwQeRt"
# The app's own variables: tests never see the developer's (nor any TASKAPP_* or MODAL_* setting).
OWN_VARIABLES = (
    "ENVIRONMENT_API_KEY",
    "DEV_ENVIRONMENT_API_KEY",
    "ENVIRONMENT_API_KEY_ALIASES",
    "OPENAI_API_KEY",
    "GROQ_API_KEY",
)
OWN_PREFIXES = ("TASKAPP_", "MODAL_")


def is_own_variable(name: str) -> bool:
    return name.startswith(OWN_PREFIXES) or name in OWN_VARIABLES


@contextmanager
def without_own_variables() -> Iterator[None]:
    """os.environ without the app's own variables until the block ends (then as it was)."""
    saved = dict(os.environ)
    for name in list(os.environ):
        if is_own_variable(name):
            del os.environ[name]
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def key_fragments(secret: str, size: int = FRAGMENT) -> set[str]:
    return {secret[index : index + size] for index in range(len(secret) - size + 1)}


def assert_no_key_material(text: str, secrets: tuple[str, ...] = SECRETS) -> None:
    """No substring of length >= 4 of any secret occurs in `text` (checking every 4-gram suffices)."""
    for secret in secrets:
        leaked = sorted(fragment for fragment in key_fragments(secret) if fragment in text)
        assert not leaked, f"text contains pieces of a key: {leaked}"


def assert_response_keeps_keys(response: httpx.Response, secrets: tuple[str, ...] = SECRETS) -> None:
    response.read()
    headers = "\n".join(f"{name}: {value}" for name, value in response.headers.multi_items())
    assert_no_key_material(response.content.decode("utf-8", "replace") + "\n" + headers, secrets)


# --- the whole suite's logs ------------------------------------------------------------------------
#
# Every log record of the session, from any logger and any thread (uvicorn's non-propagating loggers
# included), passes through `KEY_GUARD` on its way to the handlers, with `task_app` at DEBUG; the
# session fails at the end if any record (message, exception, `extra` fields) held a 4-character piece
# of a configured key. Servers run as child processes have their logs checked when they stop.
# `tests/test_security.py` checks that the guard is installed and catches a leak.

_RECORD_ATTRIBUTES = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class KeyGuard:
    def __init__(self, secrets: tuple[str, ...] = SECRETS) -> None:
        self.secrets = secrets
        self.checked = 0
        self.leaks: list[str] = []
        self._lock = threading.Lock()

    @staticmethod
    def text_of(record: logging.LogRecord) -> str:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a malformed %-format still has its parts checked
            message = f"{record.msg!r} {record.args!r}"
        parts = [message, record.exc_text or "", record.stack_info or ""]
        if record.exc_info and record.exc_info[1] is not None:
            parts.append(logging.Formatter().formatException(record.exc_info))
        parts.extend(f"{name}={value!r}" for name, value in record.__dict__.items() if name not in _RECORD_ATTRIBUTES)
        return "\n".join(parts)

    def leaked(self, text: str) -> list[str]:
        return sorted({piece for secret in self.secrets for piece in key_fragments(secret) if piece in text})

    def check(self, record: logging.LogRecord) -> None:
        text = self.text_of(record)
        found = self.leaked(text)
        with self._lock:
            self.checked += 1
            if found:
                self.leaks.append(f"{record.name} {record.levelname}: {found} in {text[:300]!r}")


KEY_GUARD = KeyGuard()
_unguarded_handle = logging.Logger.handle


def guarded_handle(self: logging.Logger, record: logging.LogRecord) -> None:
    KEY_GUARD.check(record)
    _unguarded_handle(self, record)


def install_key_guard() -> None:
    logging.Logger.handle = guarded_handle  # type: ignore[method-assign]
    logging.getLogger("task_app").setLevel(logging.DEBUG)  # every line the app can write is checked


def uninstall_key_guard() -> None:
    logging.Logger.handle = _unguarded_handle  # type: ignore[method-assign]
