"""The one error-body check, and the response hook that no client mistake is a server error."""

from __future__ import annotations

import re
from typing import Any

import httpx

from task_app.core.contracts import ErrorResponse


def error_body(response: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    """The one error-body check: exactly `status`, JSON, `{"error": {"code", "message", ...}, "detail":
    message}` with a message (and `code`, when given), in JSON's words: no Python `None` (a message
    built from a missing value once said "unknown env_name None"). Returns the body."""
    assert response.status_code == status, response.text
    assert not re.search(r"\bNone\b", response.text), response.text
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body: dict[str, Any] = response.json()
    parsed = ErrorResponse.model_validate(body)
    assert parsed.detail == parsed.error.message and parsed.error.message, body
    if code is not None:
        assert parsed.error.code == code, body
    return body


def assert_not_a_server_error(response: httpx.Response) -> None:
    """A client mistake is never a 500 (docs/contract.md, "Errors"); nothing these tests send is a server fault."""
    assert response.status_code != 500, response.read()
