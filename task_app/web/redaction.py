"""OpenEnv session tokens never reach a log line: the server's own loggers (uvicorn's access log, and
the WebSocket lines uvicorn writes to `uvicorn.error`) get a filter that replaces the token in a path
`/openenv/t/<token>/...` with `***` before any handler formats the record."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

TOKEN_IN_PATH = re.compile(r"(/openenv/t/)[^/\s\"'?#]+")
SERVER_LOGGERS = ("uvicorn.access", "uvicorn.error", "uvicorn")


def redact(text: str) -> str:
    return TOKEN_IN_PATH.sub(r"\1***", text)


def _redacted(value: Any) -> Any:
    return redact(value) if isinstance(value, str) else value


class TokenRedaction(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_redacted(arg) for arg in record.args)
        elif isinstance(record.args, dict):
            record.args = {key: _redacted(value) for key, value in record.args.items()}
        return True


@contextmanager
def tokens_kept_out_of_server_logs() -> Iterator[None]:
    """While the app serves: the filter on every server logger (they are process-wide; removed after)."""
    redaction = TokenRedaction()
    loggers = [logging.getLogger(name) for name in SERVER_LOGGERS]
    for logger in loggers:
        logger.addFilter(redaction)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(redaction)
