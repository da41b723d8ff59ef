"""Outbound HTTP: everything the server sends (model calls, vendor proxy calls and their streams, run
callbacks) goes through the process's one client, `Outbound`, a keep-alive pool of HTTP/1.1
connections (`core.http1`; why not a library's: docs/decisions/http-client.md). The callers see only
`post`, `open_stream` and their outcomes:

    Answer           any HTTP status; the body read up to `max_bytes` (2xx) or `ERROR_BODY_BYTES` (others)
    AnswerTooLarge   a 2xx body longer than `max_bytes` (refused from Content-Length or cut while reading)
    Stream           (open_stream) any HTTP status, the body not read yet: `chunks()` as they arrive,
                     `read_error()` for a non-2xx one; `close()` after
    SendFailure      no HTTP answer, or (from `Stream.chunks`) the body broke off; `kind` says how

It stores no cookies (rollouts of different trainers share it), follows no redirects and reads no proxy
environment variables. The pool's size follows the rollout cap (`Settings.outbound_max_connections`):
one connection per rollout's model call, as many again for the proxies and callbacks.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from . import http1

logger = logging.getLogger(__name__)

ERROR_BODY_BYTES = 4096  # enough for a vendor's error JSON; the rest of an error body is dropped
_OK_MIN, _OK_MAX = 200, 299
Target = http1.Target


@dataclass(frozen=True, slots=True)
class Outbound:
    """The process's outbound HTTP client."""

    pool: http1.Pool

    def report(self, rollout_cap: int) -> dict[str, Any]:
        """The pool for `/health`: its size, what is open, and a `warning` when it is smaller than the cap."""
        pool = self.pool
        report: dict[str, Any] = {"max_connections": pool.max_connections, "open": pool.open, "idle": pool.idle}
        warning = pool_warning(pool.max_connections, rollout_cap)
        if warning is not None:
            report["warning"] = warning
        return report


def pool_warning(max_connections: int, rollout_cap: int) -> str | None:
    """What a pool smaller than the rollout cap costs, or None when it is not."""
    if max_connections >= rollout_cap:
        return None
    return (
        f"TASKAPP_INFERENCE_MAX_CONNECTIONS ({max_connections}) is below TASKAPP_MAX_CONCURRENT_ROLLOUTS "
        f"({rollout_cap}): beyond {max_connections} rollouts, model calls wait for a free connection "
        "(leave it unset to follow the cap)"
    )


@asynccontextmanager
async def open_session(max_connections: int, *, rollout_cap: int | None = None) -> AsyncIterator[Outbound]:
    """The process's client; `max_connections` bounds the sockets open to all hosts together. With
    `rollout_cap`, a log line says the pool's size, as a warning when it is smaller than the cap."""
    if rollout_cap is not None:
        warning = pool_warning(max_connections, rollout_cap)
        if warning is not None:
            logger.warning("outbound pool: %s", warning)
        else:
            logger.info("outbound pool: at most %d connections (%d rollouts)", max_connections, rollout_cap)
    pool = http1.Pool(max_connections)
    try:
        yield Outbound(pool)
    finally:
        await pool.close()


POLICY_VERSION_HEADER = "x-policy-version"  # set by a trainer's model server: the weights' version that answered


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes
    retry_after: str | None
    should_retry: str | None = None  # the server's `x-should-retry` header, if any
    policy_version: str | None = None  # the model server's `x-policy-version` header, if any (docs/training-data.md)

    @property
    def ok(self) -> bool:
        return _OK_MIN <= self.status <= _OK_MAX


class AnswerTooLarge(Exception):
    """A successful (`status`: 2xx) answer longer than the caller's limit; nothing of it is returned."""

    def __init__(self, status: int, limit: int, declared: int | None) -> None:
        what = f"is {declared} bytes, more than" if declared is not None else "exceeded"
        super().__init__(f"answer {what} the {limit} bytes allowed")
        self.status, self.limit, self.declared = status, limit, declared


class SendFailure(Exception):
    """The request produced no HTTP answer."""

    TIMEOUT = http1.TIMEOUT  # connecting, waiting for a pooled connection, a read or the whole exchange took too long
    CONNECT = http1.CONNECT  # refused, unresolvable host, TLS handshake failed
    TRANSPORT = http1.TRANSPORT  # the connection broke, or the server spoke broken HTTP
    REQUEST = http1.REQUEST  # the request itself cannot be sent (URL or header values); retrying cannot help

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


def parse_url(url: str) -> Target | None:
    """The URL parsed once for reuse on every request, or None when it does not parse (then `post`
    gets the string and fails as a REQUEST failure)."""
    try:
        return http1.parse(url)
    except http1.Failure:
        return None


def _target(url: Target | str) -> Target:
    if isinstance(url, Target):
        return url
    try:
        return http1.parse(url)
    except http1.Failure as exc:
        raise SendFailure(exc.kind, str(exc)) from exc


async def post(
    client: Outbound,
    url: Target | str,
    content: bytes,
    headers: dict[str, str],
    *,
    connect_timeout_s: float,
    read_timeout_s: float,
    total_timeout_s: float,
    max_bytes: int,
) -> Answer:
    """POST `content`; `connect_timeout_s` bounds the wait for a pooled connection plus connecting,
    `read_timeout_s` each read, `total_timeout_s` the whole exchange (a server may drip bytes). A
    non-2xx body is cut at `ERROR_BODY_BYTES`."""
    limits = http1.Limits(connect_timeout_s, read_timeout_s, total_timeout_s, max_bytes, ERROR_BODY_BYTES)
    try:
        reply = await client.pool.post(_target(url), content, headers, limits)
    except http1.TooLarge as exc:
        raise AnswerTooLarge(exc.status, exc.limit, exc.declared) from exc
    except http1.Failure as exc:
        raise SendFailure(exc.kind, str(exc)) from exc
    headers_in = reply.headers
    return Answer(
        reply.status,
        reply.body,
        headers_in.get("retry-after"),
        headers_in.get("x-should-retry"),
        headers_in.get(POLICY_VERSION_HEADER),
    )


class Stream:
    """An answer whose body is read as it arrives. The caller must `close()` it (idempotent): the
    connection goes back to the pool when the body was read to its end, and is dropped otherwise."""

    def __init__(self, streamed: http1.Streamed) -> None:
        self._streamed = streamed
        self.status = streamed.status
        self.content_type = streamed.headers.get("content-type")
        self.retry_after = streamed.headers.get("retry-after")
        self.should_retry = streamed.headers.get("x-should-retry")

    @property
    def ok(self) -> bool:
        return _OK_MIN <= self.status <= _OK_MAX

    async def read_error(self) -> bytes:
        """The first `ERROR_BODY_BYTES` of a non-2xx body."""
        chunks: list[bytes] = []
        size = 0
        while size < ERROR_BODY_BYTES and (chunk := await self._next()) is not None:
            chunks.append(chunk[: ERROR_BODY_BYTES - size])
            size += len(chunks[-1])
        return b"".join(chunks)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; SendFailure when it breaks off or a time limit passes."""
        while (chunk := await self._next()) is not None:
            yield chunk

    async def _next(self) -> bytes | None:
        try:
            return await self._streamed.next_chunk()
        except http1.Failure as exc:
            raise SendFailure(exc.kind, str(exc)) from exc

    def close(self) -> None:
        self._streamed.close()


async def open_stream(
    client: Outbound,
    url: Target | str,
    content: bytes,
    headers: dict[str, str],
    *,
    connect_timeout_s: float,
    read_timeout_s: float,
    total_timeout_s: float,
) -> Stream:
    """POST `content` and return once the status line and headers are in; the limits are `post`'s,
    `total_timeout_s` bounding the whole exchange, body included."""
    limits = http1.Limits(connect_timeout_s, read_timeout_s, total_timeout_s, 0, 0)  # no size limit: the reader's
    try:
        streamed = await client.pool.stream(_target(url), content, headers, limits)
    except http1.Failure as exc:
        raise SendFailure(exc.kind, str(exc)) from exc
    return Stream(streamed)
