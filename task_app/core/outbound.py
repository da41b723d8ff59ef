"""Outbound HTTP: the app's one pooled client session, one capped POST for model servers and vendors,
and one streamed POST for the proxies' `stream: true`.

aiohttp rather than httpx for this one job: a chat-completions POST over loopback costs the server
~0.10 ms of CPU with aiohttp against ~0.45 ms with httpx (httpcore's pool bookkeeping and the
pure-Python h11 parser; aiohttp parses with C), and every decision of every rollout pays it
(benchmarks/, B1). The callers see only `post`, `open_stream` and their outcomes:

    Answer           any HTTP status; the body read up to `max_bytes` (2xx) or `ERROR_BODY_BYTES` (others)
    AnswerTooLarge   a 2xx body longer than `max_bytes` (refused from Content-Length or cut while reading)
    Stream           (open_stream) any HTTP status, the body not read yet: `chunks()` as they arrive,
                     `read_error()` for a non-2xx one; `close()` drops the connection
    SendFailure      no HTTP answer, or (from `Stream.chunks`) the body broke off; `kind` says how

The session never stores cookies (rollouts of different trainers share it), never follows redirects,
and ignores proxy environment variables.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import aiohttp
from yarl import URL

ERROR_BODY_BYTES = 4096  # enough for a vendor's error JSON; the rest of an error body is dropped
_OK_MIN, _OK_MAX = 200, 299


def open_session(max_connections: int) -> aiohttp.ClientSession:
    """The process's session; `max_connections` bounds the sockets open to all hosts together."""
    connector = aiohttp.TCPConnector(limit=max_connections, limit_per_host=0)
    return aiohttp.ClientSession(
        connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False, raise_for_status=False
    )


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes
    retry_after: str | None
    should_retry: str | None = None  # the server's `x-should-retry` header, if any

    @property
    def ok(self) -> bool:
        return _OK_MIN <= self.status <= _OK_MAX


class AnswerTooLarge(Exception):
    """A successful answer longer than the caller's limit; nothing of it is returned."""

    def __init__(self, limit: int, declared: int | None) -> None:
        what = f"is {declared} bytes, more than" if declared is not None else "exceeded"
        super().__init__(f"answer {what} the {limit} bytes allowed")
        self.limit, self.declared = limit, declared


class SendFailure(Exception):
    """The request produced no HTTP answer."""

    TIMEOUT = "timeout"  # connecting, waiting for a pooled connection, a read or the whole exchange took too long
    CONNECT = "connect"  # refused, unresolvable host, TLS handshake failed
    TRANSPORT = "transport"  # the connection broke, or the server spoke broken HTTP
    REQUEST = "request"  # the request itself cannot be sent (URL or header values); retrying cannot help

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


def parse_url(url: str) -> URL | None:
    """The URL parsed once for reuse on every request, or None when it does not parse (then `post`
    gets the string and fails as a REQUEST failure)."""
    try:
        return URL(url)
    except (ValueError, TypeError):
        return None


async def post(
    session: aiohttp.ClientSession,
    url: URL | str,
    content: bytes,
    headers: dict[str, str],
    *,
    connect_timeout_s: float,
    read_timeout_s: float,
    total_timeout_s: float,
    max_bytes: int,
) -> Answer:
    """POST `content`; `connect_timeout_s` bounds the wait for a pooled connection plus connecting,
    `read_timeout_s` each read, `total_timeout_s` the whole exchange (a server may drip bytes)."""
    timeout = _timeout(connect_timeout_s, read_timeout_s, total_timeout_s)
    with _send_failures():
        async with session.post(url, data=content, headers=headers, timeout=timeout, allow_redirects=False) as response:
            status = response.status
            if _OK_MIN <= status <= _OK_MAX:
                body = await _read(response, max_bytes)
            else:
                body = await _read(response, ERROR_BODY_BYTES, truncate=True)
            return Answer(status, body, response.headers.get("Retry-After"), response.headers.get("x-should-retry"))


class Stream:
    """An answer whose body is read as it arrives. The caller must `close()` it (idempotent)."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status
        self.content_type = response.headers.get("Content-Type")
        self.retry_after = response.headers.get("Retry-After")
        self.should_retry = response.headers.get("x-should-retry")

    @property
    def ok(self) -> bool:
        return _OK_MIN <= self.status <= _OK_MAX

    async def read_error(self) -> bytes:
        """The first `ERROR_BODY_BYTES` of a non-2xx body."""
        with _send_failures():
            return await _read(self._response, ERROR_BODY_BYTES, truncate=True)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; SendFailure when it breaks off or a time limit passes."""
        with _send_failures():
            async for chunk in self._response.content.iter_any():
                yield chunk

    def close(self) -> None:
        """Drop the connection (a half-read body cannot go back to the pool)."""
        self._response.close()


async def open_stream(
    session: aiohttp.ClientSession,
    url: URL | str,
    content: bytes,
    headers: dict[str, str],
    *,
    connect_timeout_s: float,
    read_timeout_s: float,
    total_timeout_s: float,
) -> Stream:
    """POST `content` and return once the status line and headers are in; the limits are `post`'s,
    `total_timeout_s` bounding the whole exchange, body included."""
    timeout = _timeout(connect_timeout_s, read_timeout_s, total_timeout_s)
    with _send_failures():
        response = await session.post(url, data=content, headers=headers, timeout=timeout, allow_redirects=False)
    return Stream(response)


def _timeout(connect_s: float, read_s: float, total_s: float) -> aiohttp.ClientTimeout:
    # ceil_threshold=inf: aiohttp would otherwise round timeouts of 5 s and more up to a whole second.
    return aiohttp.ClientTimeout(total=total_s, connect=connect_s, sock_read=read_s, ceil_threshold=math.inf)


@contextmanager
def _send_failures() -> Iterator[None]:
    """aiohttp's exceptions as SendFailure kinds."""
    try:
        yield
    except TimeoutError as exc:  # aiohttp's connect and read timeouts are TimeoutErrors
        raise SendFailure(SendFailure.TIMEOUT, type(exc).__name__) from exc
    except aiohttp.ClientConnectorError as exc:
        raise SendFailure(SendFailure.CONNECT, f"{type(exc).__name__}: {exc.strerror or exc}") from exc
    except (aiohttp.InvalidURL, ValueError) as exc:  # an unusable URL, or a header value with a newline
        raise SendFailure(SendFailure.REQUEST, type(exc).__name__) from exc
    except aiohttp.ClientError as exc:
        raise SendFailure(SendFailure.TRANSPORT, type(exc).__name__) from exc


async def _read(response: aiohttp.ClientResponse, limit: int, *, truncate: bool = False) -> bytes:
    """At most `limit` bytes: beyond it an error body is cut, an answer refused. Leaving early closes
    the connection instead of returning it to the pool."""
    declared = response.content_length
    if not truncate and declared is not None and declared > limit:
        raise AnswerTooLarge(limit, declared)
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > limit:
            if truncate:
                chunks.append(chunk[: len(chunk) - (size - limit)])
                break
            raise AnswerTooLarge(limit, None)
        chunks.append(chunk)
    return b"".join(chunks)
