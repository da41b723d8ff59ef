"""Keep-alive HTTP/1.1 connections for one job: POST a body, read the whole answer (a model call).

    Pool.post(url, content, headers, limits) ──► an idle connection to the host, or a new one
        (at most `max_connections` open in all) ──► the request written in one `write` ──► the
        answer parsed by httptools (llhttp, C) as it arrives ──► Reply(status, headers, body)

Every decision of every rollout makes one such call, and aiohttp's machinery for it (request and
response objects, header multidicts, a timer rescheduled per read, several tasks and callbacks) was
a quarter of the server's GIL samples; through this pool it is a small fraction
(docs/decisions/http-client.md). It does only what that call needs:
no redirects, cookies, proxies, compression or streaming (`core.outbound` keeps aiohttp for streams).

- Time limits: `connect_s` bounds the wait for a free connection plus connecting (TCP, TLS);
  `read_s` the silence between two reads; `total_s` the whole call, from `post` to the last byte
  (waiting, connecting and a retry included). One timer per exchange, re-armed only when it fires early.
- A 2xx body longer than `max_bytes` is refused, from its Content-Length or while reading
  (`TooLarge`); any other body is cut after `error_bytes` and returned. Either way the connection is
  closed, never reused.
- A connection that is idle in the pool may have been closed by the server a moment ago (keep-alive
  timeouts). If a reused connection ends before a byte of the answer arrived, the request is sent
  once more on a new connection, as urllib3 and httpcore do.
- Failures are `Failure(kind, detail)` with the kinds of `core.outbound.SendFailure`.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from dataclasses import dataclass
from typing import cast

import httptools
from yarl import URL

TIMEOUT, CONNECT, TRANSPORT, REQUEST = "timeout", "connect", "transport", "request"
_DEFAULT_PORTS = {"http": 80, "https": 443}
_FORBIDDEN_IN_HEADERS = ("\r", "\n", "\0")
_OK_MIN, _OK_MAX = 200, 299
_INFORMATIONAL_MIN, _INFORMATIONAL_MAX = 100, 199
USER_AGENT = "task-app"


class Failure(Exception):
    """No usable HTTP answer; `kind` is one of TIMEOUT, CONNECT, TRANSPORT, REQUEST."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


class TooLarge(Exception):
    """A body longer than the caller's limit (`declared`: its Content-Length, when it said so)."""

    def __init__(self, limit: int, declared: int | None) -> None:
        super().__init__(limit, declared)
        self.limit, self.declared = limit, declared


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    body: bytes


@dataclass(frozen=True, slots=True)
class Limits:
    connect_s: float
    read_s: float
    total_s: float
    max_bytes: int  # of a 2xx body: longer is refused
    error_bytes: int  # of any other body: longer is cut


_Key = tuple[str, str, int]  # scheme, host, port


class _Stop(Exception):
    """Raised inside a parser callback to stop parsing: the exchange is over."""


class _Connection(asyncio.Protocol):
    """One socket and its response parser; at most one exchange at a time."""

    def __init__(self, pool: Pool, key: _Key) -> None:
        self.pool, self.key = pool, key
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[Reply] | None = None
        self._limits: Limits | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._status = 0
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._size = 0
        self._cap = 0  # the body's byte limit, once the status is known
        self._truncate = False  # past the limit: cut (an error body) rather than refuse
        self._received = False  # any byte of the answer yet
        self._headers_done = False
        self._framed = False  # the answer says where its body ends (Content-Length or chunked)
        self._keep_alive = False
        self._last_read = 0.0
        self._deadline = 0.0

    # --- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream transport, TCP or TLS

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():  # bytes nobody asked for: the connection is unusable
            self.close()
            return
        self._received = True
        self._last_read = self.loop.time()
        try:
            self._parser.feed_data(data)
        except _Stop:  # pragma: no cover - httptools reports a callback's exception as a parser error
            pass
        except httptools.HttpParserError as exc:
            if not isinstance(exc.__context__, _Stop):
                self._fail(Failure(TRANSPORT, f"invalid HTTP answer: {exc}"))

    def eof_received(self) -> bool:
        return False  # close our end as well; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool._lost(self)
        if self._waiter is not None and not self._waiter.done():
            if self._headers_done and not self._framed and exc is None:  # a body that ends with the connection
                self._keep_alive = False
                self._finish()
            else:
                lost = f"connection closed: {type(exc).__name__}" if exc else "server closed the connection"
                self._fail(Failure(TRANSPORT, lost))
        # The parser refers to this protocol, and a failed answer's exception (in the waiter) to the
        # frames that hold it: without both, a lost connection is freed with its last reference, not at
        # the next full garbage collection, and so is what it read (up to `max_bytes` of a refused
        # answer; the soak's RSS plateau fell to a third: docs/performance.md).
        del self._parser
        self._waiter, self._body = None, []

    # --- httptools callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._waiter is None or self._waiter.done():  # a second answer to one request
            self.close()
            raise _Stop

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        if _INFORMATIONAL_MIN <= self._status <= _INFORMATIONAL_MAX:
            return
        self._headers_done = True
        headers, limits = self._headers, self._limits
        self._framed = "content-length" in headers or "chunked" in headers.get("transfer-encoding", "").lower()
        if limits is None:  # pragma: no cover - send() sets them before any byte can arrive
            return
        ok = _OK_MIN <= self._status <= _OK_MAX
        self._cap, self._truncate = (limits.max_bytes, False) if ok else (limits.error_bytes, True)
        declared = headers.get("content-length", "")
        if ok and declared.isdigit() and int(declared) > self._cap:
            self._fail(TooLarge(self._cap, int(declared)))
            raise _Stop

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > self._cap:
            if not self._truncate:
                self._fail(TooLarge(self._cap, None))
                raise _Stop
            self._body.append(body[: len(body) - (self._size - self._cap)])
            self._keep_alive = False
            self._finish()
            raise _Stop
        self._body.append(body)

    def on_message_complete(self) -> None:
        if not self._headers_done:  # an informational (1xx) answer: the real one follows
            self._headers.clear()
            return
        self._keep_alive = self._parser.should_keep_alive()
        self._finish()

    # --- one exchange ----------------------------------------------------------------------------

    def send(self, request: bytes, limits: Limits, deadline: float) -> asyncio.Future[Reply]:
        """Write `request`; the future is its answer, failed at `deadline` (loop time) at the latest."""
        transport = self.transport
        if transport is None or self.closed:  # pragma: no cover - the pool hands out open connections only
            raise Failure(TRANSPORT, "connection closed")
        self._waiter = waiter = self.loop.create_future()
        self._limits = limits
        self._status, self._size = 0, 0
        self._headers, self._body = {}, []
        self._received = self._headers_done = self._framed = self._keep_alive = False
        now = self.loop.time()
        self._last_read, self._deadline = now, deadline
        self._timer = self.loop.call_at(min(self._deadline, now + limits.read_s), self._check_time)
        transport.write(request)
        return waiter

    @property
    def reusable(self) -> bool:
        return self._keep_alive and not self.closed

    @property
    def answered(self) -> bool:
        """Whether any byte of the last answer arrived (a stale connection fails before that)."""
        return self._received

    def _check_time(self) -> None:
        limits = self._limits
        if self._waiter is None or self._waiter.done() or limits is None:
            return
        now = self.loop.time()
        if now >= self._deadline:
            self._fail(Failure(TIMEOUT, f"no complete answer within {limits.total_s:g} s"))
        elif now - self._last_read >= limits.read_s:
            self._fail(Failure(TIMEOUT, f"nothing read for {limits.read_s:g} s"))
        else:
            self._timer = self.loop.call_at(min(self._deadline, self._last_read + limits.read_s), self._check_time)

    def _finish(self) -> None:
        waiter = self._waiter
        self._cancel_timer()
        if waiter is not None and not waiter.done():
            waiter.set_result(Reply(self._status, self._headers, b"".join(self._body)))
        self._body = []

    def _fail(self, exc: Exception) -> None:
        waiter = self._waiter
        self._cancel_timer()
        self._keep_alive = False
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.close()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self) -> None:
        self._cancel_timer()
        self._keep_alive = False
        if self.transport is not None and not self.closed:
            self.transport.close()  # connection_lost follows, which tells the pool


class Pool:
    """Idle keep-alive connections per (scheme, host, port), at most `max_connections` open in all."""

    def __init__(self, max_connections: int, *, tls: ssl.SSLContext | None = None) -> None:
        """`tls`: the context for https (default: the system's trust store, made on first use)."""
        self.max_connections = max_connections
        self._idle: dict[_Key, list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._opening = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._tls = tls
        self._closed = False

    async def post(self, url: URL, content: bytes, headers: dict[str, str], limits: Limits) -> Reply:
        key, request = _request(url, content, headers)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limits.total_s  # the whole exchange: waiting, connecting, a retry
        connection = self._take(key)
        if connection is not None:
            try:
                return await self._exchange(connection, request, limits, deadline)
            except Failure as failure:
                if connection.answered or failure.kind != TRANSPORT:
                    raise
            # the server had closed this idle connection: once more, on a new one
        connection = await self._connect(key, max(0.0, min(limits.connect_s, deadline - loop.time())))
        return await self._exchange(connection, request, limits, deadline)

    async def close(self) -> None:
        self._closed = True
        for connection in list(self._open):
            connection.close()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        await asyncio.sleep(0)  # let the transports run their connection_lost

    # --- the pool ------------------------------------------------------------------------------

    async def _exchange(self, connection: _Connection, request: bytes, limits: Limits, deadline: float) -> Reply:
        try:
            reply = await connection.send(request, limits, deadline)
        except BaseException:  # failed, cancelled or too large: the connection goes with the exchange
            connection.close()
            raise
        self._release(connection)
        return reply

    def _take(self, key: _Key) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()
            if not connection.closed:
                return connection
        return None

    def _release(self, connection: _Connection) -> None:
        if connection.reusable and not self._closed:
            self._idle.setdefault(connection.key, []).append(connection)
            self._wake()
        else:
            connection.close()

    def _lost(self, connection: _Connection) -> None:
        self._open.discard(connection)
        idle = self._idle.get(connection.key)
        if idle and connection in idle:
            idle.remove(connection)
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _evict_idle(self) -> bool:
        """Close one idle connection to another host to make room; False when there is none."""
        for idle in self._idle.values():
            if idle:
                idle.pop(0).close()
                return True
        return False

    async def _connect(self, key: _Key, timeout_s: float) -> _Connection:
        if self._closed:
            raise Failure(TRANSPORT, "the HTTP pool is closed")
        try:
            async with asyncio.timeout(timeout_s):
                while len(self._open) + self._opening >= self.max_connections and not self._evict_idle():
                    waiter = asyncio.get_running_loop().create_future()
                    self._waiters.append(waiter)
                    try:
                        await waiter
                    except BaseException:  # timed out or cancelled, perhaps just after a wake-up: pass it on
                        if waiter.done() and not waiter.cancelled():
                            self._wake()
                        raise
                    if self._closed:
                        raise Failure(TRANSPORT, "the HTTP pool is closed")
                    idle = self._take(key)  # released while we waited
                    if idle is not None:
                        return idle
                self._opening += 1
                try:
                    return await self._open_connection(key)
                finally:
                    self._opening -= 1
        except TimeoutError as exc:
            raise Failure(TIMEOUT, f"no connection within {timeout_s:g} s") from exc

    async def _open_connection(self, key: _Key) -> _Connection:
        scheme, host, port = key
        tls = self._tls_context() if scheme == "https" else None
        loop = asyncio.get_running_loop()
        try:
            _, connection = await loop.create_connection(
                lambda: _Connection(self, key), host, port, ssl=tls, server_hostname=host if tls else None
            )
        except (OSError, ssl.SSLError) as exc:  # refused, unreachable, unresolvable, TLS handshake
            raise Failure(CONNECT, f"{type(exc).__name__}: {exc.strerror or exc}") from exc
        self._open.add(connection)
        return connection

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls


def _request(url: URL, content: bytes, headers: dict[str, str]) -> tuple[_Key, bytes]:
    """The pool key and the request's bytes: head and body in one buffer, for one write."""
    scheme, host = url.scheme, url.raw_host
    if scheme not in _DEFAULT_PORTS or not host:
        raise Failure(REQUEST, f"not an http(s) URL with a host: scheme {scheme!r}")
    port = url.port or _DEFAULT_PORTS[scheme]
    authority = f"[{host}]" if ":" in host else host
    if port != _DEFAULT_PORTS[scheme]:
        authority = f"{authority}:{port}"
    lines = [f"POST {url.raw_path_qs} HTTP/1.1", f"Host: {authority}", f"Content-Length: {len(content)}"]
    if "user-agent" not in {name.lower() for name in headers}:
        lines.append(f"User-Agent: {USER_AGENT}")
    for name, value in headers.items():
        if any(bad in name or bad in value for bad in _FORBIDDEN_IN_HEADERS) or ":" in name:
            raise Failure(REQUEST, "a header name or value holds a line break or a NUL")
        lines.append(f"{name}: {value}")
    try:
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    except UnicodeEncodeError as exc:
        raise Failure(REQUEST, "a header is not Latin-1 text") from exc
    return (scheme, host, port), head + content
