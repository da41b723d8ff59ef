"""Outbound HTTP: the app's one client (`Outbound`), one capped POST for model servers, vendors and run callbacks,
and one streamed POST for the proxies' `stream: true`.

Every decision of every rollout makes one POST, so its CPU counts: it goes through `core.http1`'s
keep-alive pool (cheaper per decision than aiohttp, which was cheaper than httpx:
docs/decisions/http-client.md); the streams, rare and long, through aiohttp. The callers see only
`post`, `open_stream` and their outcomes:

    Answer           any HTTP status; the body read up to `max_bytes` (2xx) or `ERROR_BODY_BYTES` (others)
    AnswerTooLarge   a 2xx body longer than `max_bytes` (refused from Content-Length or cut while reading)
    Stream           (open_stream) any HTTP status, the body not read yet: `chunks()` as they arrive,
                     `read_error()` for a non-2xx one; `close()` drops the connection
    SendFailure      no HTTP answer, or (from `Stream.chunks`) the body broke off; `kind` says how

Neither stores cookies (rollouts of different trainers share them), follows redirects or reads proxy
environment variables.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

import aiohttp
from yarl import URL

from . import http1

ERROR_BODY_BYTES = 4096  # enough for a vendor's error JSON; the rest of an error body is dropped
_OK_MIN, _OK_MAX = 200, 299


@dataclass(frozen=True, slots=True)
class Outbound:
    """The process's outbound HTTP: `pool` for POSTs, `session` for streams."""

    pool: http1.Pool
    session: aiohttp.ClientSession


@asynccontextmanager
async def open_session(max_connections: int) -> AsyncIterator[Outbound]:
    """The process's client; `max_connections` bounds the sockets open to all hosts together, for the
    POSTs and for the streams each."""
    connector = aiohttp.TCPConnector(limit=max_connections, limit_per_host=0)
    session = aiohttp.ClientSession(
        connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False, raise_for_status=False
    )
    pool = http1.Pool(max_connections)
    try:
        async with session:
            yield Outbound(pool, session)
    finally:
        await pool.close()


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

    TIMEOUT = http1.TIMEOUT  # connecting, waiting for a pooled connection, a read or the whole exchange took too long
    CONNECT = http1.CONNECT  # refused, unresolvable host, TLS handshake failed
    TRANSPORT = http1.TRANSPORT  # the connection broke, or the server spoke broken HTTP
    REQUEST = http1.REQUEST  # the request itself cannot be sent (URL or header values); retrying cannot help

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
    client: Outbound,
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
    `read_timeout_s` each read, `total_timeout_s` the whole exchange (a server may drip bytes). A
    non-2xx body is cut at `ERROR_BODY_BYTES`."""
    if not isinstance(url, URL):
        parsed = parse_url(url)
        if parsed is None:
            raise SendFailure(SendFailure.REQUEST, "the URL does not parse")
        url = parsed
    limits = http1.Limits(connect_timeout_s, read_timeout_s, total_timeout_s, max_bytes, ERROR_BODY_BYTES)
    try:
        reply = await client.pool.post(url, content, headers, limits)
    except http1.TooLarge as exc:
        raise AnswerTooLarge(exc.limit, exc.declared) from exc
    except http1.Failure as exc:
        raise SendFailure(exc.kind, str(exc)) from exc
    headers_in = reply.headers
    return Answer(reply.status, reply.body, headers_in.get("retry-after"), headers_in.get("x-should-retry"))


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
            return await _read_cut(self._response, ERROR_BODY_BYTES)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; SendFailure when it breaks off or a time limit passes."""
        with _send_failures():
            async for chunk in self._response.content.iter_any():
                yield chunk

    def close(self) -> None:
        """Drop the connection (a half-read body cannot go back to the pool)."""
        self._response.close()


async def open_stream(
    client: Outbound,
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
        response = await client.session.post(url, data=content, headers=headers, timeout=timeout, allow_redirects=False)
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


async def _read_cut(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """At most `limit` bytes of a body, the rest cut (leaving early closes the connection)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > limit:
            chunks.append(chunk[: len(chunk) - (size - limit)])
            break
        chunks.append(chunk)
    return b"".join(chunks)
