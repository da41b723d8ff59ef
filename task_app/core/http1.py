"""Keep-alive HTTP/1.1 connections for the server's outbound POSTs: a model call, a vendor proxy call, a
run callback. Why the app has its own: docs/decisions/http-client.md.

    Pool.post(target, content, headers, limits)    ─► an idle connection to the host, or a new one (at
    Pool.stream(target, content, headers, limits)     most `max_connections` open in all) ─► the request
                                                      written in one `write` ─► the answer parsed by
                                                      httptools (llhttp, C) as it arrives
    post   ─► Reply(status, headers, body): the whole answer
    stream ─► Streamed(status, headers): the body read chunk by chunk (`next_chunk`), `close()` after

- Connecting: Happy Eyeballs (RFC 8305) when the host resolves to several addresses: the next one is
  tried `HAPPY_EYEBALLS_DELAY_S` after the last began, without waiting for it to fail, alternating
  address families; TLS for https with the system's trust store (or the given context).
- Time limits: `connect_s` bounds the wait for a free connection plus connecting (TCP, TLS);
  `read_s` the silence between two reads (while a stream's reader is slow and reading is paused, the
  silence is not the server's and does not count); `total_s` the whole call, from `post` or `stream`
  to the last byte (waiting, connecting and a retry included). One timer per exchange, re-armed only
  when it fires early.
- `post`: a 2xx body longer than `max_bytes` is refused, from its Content-Length or while reading
  (`TooLarge`); any other body is cut after `error_bytes` and returned. Either way the connection is
  closed, never reused. `stream` applies no size limit: its reader decides.
- A connection that is idle in the pool may have been closed by the server a moment ago (keep-alive
  timeouts). If a reused connection ends before a byte of the answer arrived, the request is sent
  once more on a new connection, as urllib3 and httpcore do. A connection idle for `keepalive_s` is
  closed (a sweep every `keepalive_s` while any is idle), so a burst's sockets do not stay open.
- Not done: redirects, cookies, proxies (the environment's variables are not read), compression
  (no Accept-Encoding is sent), HTTP/2, request bodies other than bytes.
- Failures are `Failure(kind, detail)` with the kinds of `core.outbound.SendFailure`.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections import deque
from dataclasses import dataclass
from typing import cast
from urllib.parse import quote, urlsplit

import httptools

TIMEOUT, CONNECT, TRANSPORT, REQUEST = "timeout", "connect", "transport", "request"
HAPPY_EYEBALLS_DELAY_S = 0.25  # RFC 8305's recommended connection attempt delay
KEEPALIVE_S = 5.0  # as httpx: below the idle timeout of most servers (uvicorn's and Node's are 5 s)
USER_AGENT = "task-app"
_DEFAULT_PORTS = {"http": 80, "https": 443}
_FORBIDDEN_IN_HEADERS = ("\r", "\n", "\0")
_OK_MIN, _OK_MAX = 200, 299
_INFORMATIONAL_MIN, _INFORMATIONAL_MAX = 100, 199
_HIGH_WATER, _LOW_WATER = 256 * 1024, 64 * 1024  # a stream's unread bytes: pause reading above, resume below
# What a request target may hold unescaped (RFC 3986 pchar, "/" and "?", and "%" of existing escapes).
_SAFE_IN_TARGET = "/?%:@!$&'()*+,;=-._~"
_HOST = re.compile(r"[A-Za-z0-9._:%-]+")  # a name (IDNA-encoded) or an IP address, nothing a header could break on


class Failure(Exception):
    """No usable HTTP answer; `kind` is one of TIMEOUT, CONNECT, TRANSPORT, REQUEST."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


class TooLarge(Exception):
    """A 2xx body longer than the caller's limit (`declared`: its Content-Length, when it said so)."""

    def __init__(self, status: int, limit: int, declared: int | None) -> None:
        super().__init__(status, limit, declared)
        self.status, self.limit, self.declared = status, limit, declared


@dataclass(frozen=True, slots=True)
class Target:
    """A URL parsed once for every request to it (`parse`); `str()` is the URL as given."""

    url: str
    scheme: str
    host: str  # IDNA-encoded, without IPv6 brackets
    port: int
    head: str  # the request line and the Host header, ready to send

    @property
    def key(self) -> _Key:
        return self.scheme, self.host, self.port

    def __str__(self) -> str:
        return self.url


def parse(url: str) -> Target:
    """`url` as a Target; Failure(REQUEST) when it is not an http(s) URL with a host."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
        host = (parts.hostname or "").encode("idna").decode("ascii")
    except (ValueError, UnicodeError) as exc:
        raise Failure(REQUEST, "the URL does not parse") from exc
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not _HOST.fullmatch(host):
        raise Failure(REQUEST, f"not an http(s) URL with a host: scheme {scheme!r}")
    port = port or _DEFAULT_PORTS[scheme]
    authority = f"[{host}]" if ":" in host else host
    if port != _DEFAULT_PORTS[scheme]:
        authority = f"{authority}:{port}"
    path = quote(parts.path or "/", safe=_SAFE_IN_TARGET)
    if parts.query:
        path += "?" + quote(parts.query, safe=_SAFE_IN_TARGET)
    return Target(url, scheme, host, port, f"POST {path} HTTP/1.1\r\nHost: {authority}\r\n")


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
    max_bytes: int  # of a 2xx body: longer is refused (`post` only)
    error_bytes: int  # of any other body: longer is cut (`post` only)


_Key = tuple[str, str, int]  # scheme, host, port


class _Stop(Exception):
    """Raised inside a parser callback to stop parsing: the exchange is over."""


class _Connection(asyncio.Protocol):
    """One socket and its response parser; at most one exchange at a time, whole (`send`) or streamed
    (`send(..., streamed=True)`: the future is the head, the body follows through `next_chunk`)."""

    def __init__(self, pool: Pool, key: _Key) -> None:
        self.pool, self.key = pool, key
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[Reply] | None = None  # the answer, or (streamed) its head
        self._busy = False  # an exchange is under way: bytes are expected
        self._streamed = False
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
        # A streamed body: chunks not yet read, whether it ended, how it failed, a reader waiting.
        self._chunks: deque[bytes] = deque()
        self._ended = False
        self._error: Exception | None = None
        self._reader: asyncio.Future[None] | None = None
        self._paused = False

    # --- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream transport, TCP or TLS

    def data_received(self, data: bytes) -> None:
        if not self._busy:  # bytes nobody asked for: the connection is unusable
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
        if self._busy:
            if self._headers_done and not self._framed and exc is None:  # a body that ends with the connection
                self._keep_alive = False
                self._finish()
            else:
                lost = f"connection closed: {type(exc).__name__}" if exc else "server closed the connection"
                self._fail(Failure(TRANSPORT, lost))
        # The parser refers to this protocol, and a failed answer's exception (in the waiter) to the
        # frames that hold it: without both, a lost connection is freed with its last reference, not at
        # the next full garbage collection, and so is what it read (up to `max_bytes` of a refused answer).
        del self._parser
        self._waiter, self._body = None, []

    # --- httptools callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if not self._busy:  # a second answer to one request
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
        if self._streamed:
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_result(Reply(self._status, headers, b""))
            return
        if limits is None:  # pragma: no cover - send() sets them before any byte can arrive
            return
        ok = _OK_MIN <= self._status <= _OK_MAX
        self._cap, self._truncate = (limits.max_bytes, False) if ok else (limits.error_bytes, True)
        declared = headers.get("content-length", "")
        if ok and declared.isdigit() and int(declared) > self._cap:
            self._fail(TooLarge(self._status, self._cap, int(declared)))
            raise _Stop

    def on_body(self, body: bytes) -> None:
        if self._streamed:
            self._chunks.append(body)
            self._size += len(body)
            if self._size > _HIGH_WATER and not self._paused and self.transport is not None:
                self._paused = True
                self.transport.pause_reading()
            self._wake_reader()
            return
        self._size += len(body)
        if self._size > self._cap:
            if not self._truncate:
                self._fail(TooLarge(self._status, self._cap, None))
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

    def send(self, request: bytes, limits: Limits, deadline: float, *, streamed: bool = False) -> asyncio.Future[Reply]:
        """Write `request`; the future is its answer (streamed: its head, body b""), failed at `deadline`
        (loop time) at the latest."""
        transport = self.transport
        if transport is None or self.closed:  # pragma: no cover - the pool hands out open connections only
            raise Failure(TRANSPORT, "connection closed")
        self._waiter = waiter = self.loop.create_future()
        self._busy, self._streamed = True, streamed
        self._limits = limits
        self._status, self._size = 0, 0
        self._headers, self._body = {}, []
        self._received = self._headers_done = self._framed = self._keep_alive = False
        self._chunks, self._ended, self._error = deque(), False, None
        now = self.loop.time()
        self._last_read, self._deadline = now, deadline
        self._timer = self.loop.call_at(min(self._deadline, now + limits.read_s), self._check_time)
        transport.write(request)
        return waiter

    async def next_chunk(self) -> bytes | None:
        """The next piece of a streamed body; None once it ended; Failure when it broke off or timed out."""
        while True:
            if self._chunks:
                chunk = self._chunks.popleft()
                self._size -= len(chunk)
                if self._paused and self._size < _LOW_WATER and self.transport is not None and not self.closed:
                    self._paused = False
                    self._last_read = self.loop.time()  # the pause was ours: the read limit starts again
                    self.transport.resume_reading()
                return chunk
            if self._error is not None:
                raise self._error
            if self._ended:
                return None
            self._reader = self.loop.create_future()
            try:
                await self._reader
            finally:
                self._reader = None

    @property
    def reusable(self) -> bool:
        return self._keep_alive and not self.closed and not self._busy

    @property
    def answered(self) -> bool:
        """Whether any byte of the last answer arrived (a stale connection fails before that)."""
        return self._received

    @property
    def ended(self) -> bool:
        """Whether a streamed body was read to its end."""
        return self._ended and not self._chunks and self._error is None

    def _check_time(self) -> None:
        limits = self._limits
        if not self._busy or limits is None:
            return
        now = self.loop.time()
        if now >= self._deadline:
            self._fail(Failure(TIMEOUT, f"no complete answer within {limits.total_s:g} s"))
        elif self._paused:  # the reader is slow, not the server
            self._timer = self.loop.call_at(min(self._deadline, now + limits.read_s), self._check_time)
        elif now - self._last_read >= limits.read_s:
            self._fail(Failure(TIMEOUT, f"nothing read for {limits.read_s:g} s"))
        else:
            self._timer = self.loop.call_at(min(self._deadline, self._last_read + limits.read_s), self._check_time)

    def _finish(self) -> None:
        self._busy = False
        self._cancel_timer()
        if self._streamed:
            self._ended = True
            self._wake_reader()
            return
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(Reply(self._status, self._headers, b"".join(self._body)))
        self._body = []

    def _fail(self, exc: Exception) -> None:
        self._busy = False
        self._cancel_timer()
        self._keep_alive = False
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        elif self._streamed:  # the head was in: the body's reader gets it
            self._error = exc
            self._wake_reader()
        self.close()

    def _wake_reader(self) -> None:
        if self._reader is not None and not self._reader.done():
            self._reader.set_result(None)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self) -> None:
        self._cancel_timer()
        self._keep_alive = False
        if self.transport is not None and not self.closed:
            self.transport.close()  # connection_lost follows, which tells the pool


class Streamed:
    """A streamed answer: its status and headers, its body through `next_chunk`. `close()` (idempotent)
    gives the connection back when the body was read to its end, and drops it otherwise."""

    def __init__(self, pool: Pool, connection: _Connection, head: Reply) -> None:
        self.status, self.headers = head.status, head.headers
        self._pool: Pool | None = pool
        self._connection = connection

    async def next_chunk(self) -> bytes | None:
        return await self._connection.next_chunk()

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if self._connection.ended:
            pool._release(self._connection)
        else:
            self._connection.close()


class Pool:
    """Idle keep-alive connections per (scheme, host, port), at most `max_connections` open in all."""

    def __init__(
        self, max_connections: int, *, tls: ssl.SSLContext | None = None, keepalive_s: float = KEEPALIVE_S
    ) -> None:
        """`tls`: the context for https (default: the system's trust store, made on first use);
        `keepalive_s`: how long a connection may stay idle before it is closed."""
        self.max_connections = max_connections
        self.keepalive_s = keepalive_s
        self._idle: dict[_Key, list[_Connection]] = {}  # each list oldest first
        self._open: set[_Connection] = set()
        self._opening = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._tls = tls
        self._sweep: asyncio.TimerHandle | None = None
        self._closed = False

    @property
    def open(self) -> int:
        """Connections open now, busy or idle."""
        return len(self._open)

    @property
    def idle(self) -> int:
        return sum(len(idle) for idle in self._idle.values())

    async def post(self, target: Target, content: bytes, headers: dict[str, str], limits: Limits) -> Reply:
        connection, reply = await self._exchange(target, content, headers, limits, streamed=False)
        self._release(connection)
        return reply

    async def stream(self, target: Target, content: bytes, headers: dict[str, str], limits: Limits) -> Streamed:
        """The answer once its head is in; `limits.total_s` bounds the exchange, body included."""
        connection, head = await self._exchange(target, content, headers, limits, streamed=True)
        return Streamed(self, connection, head)

    async def close(self) -> None:
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
        for connection in list(self._open):
            connection.close()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        await asyncio.sleep(0)  # let the transports run their connection_lost

    # --- the pool ------------------------------------------------------------------------------

    async def _exchange(
        self, target: Target, content: bytes, headers: dict[str, str], limits: Limits, *, streamed: bool
    ) -> tuple[_Connection, Reply]:
        """The connection the request went out on and its answer (streamed: the head). A reused
        connection that ends before a byte of the answer arrived was stale: once more, on a new one."""
        request = _request(target, content, headers)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limits.total_s  # the whole exchange: waiting, connecting, a retry
        connection = self._take(target.key)
        if connection is not None:
            try:
                return connection, await self._answer(connection, request, limits, deadline, streamed)
            except Failure as failure:
                if connection.answered or failure.kind != TRANSPORT:
                    raise
        connection = await self._connect(target.key, max(0.0, min(limits.connect_s, deadline - loop.time())))
        return connection, await self._answer(connection, request, limits, deadline, streamed)

    @staticmethod
    async def _answer(
        connection: _Connection, request: bytes, limits: Limits, deadline: float, streamed: bool
    ) -> Reply:
        try:
            return await connection.send(request, limits, deadline, streamed=streamed)
        except BaseException:  # failed, cancelled or too large: the connection goes with the exchange
            connection.close()
            raise

    def _take(self, key: _Key) -> _Connection | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        connection = idle.pop()  # the most recently used: the likeliest to be alive
        if connection.loop.time() - connection.idle_since >= self.keepalive_s:  # so are all older ones
            for expired in [connection, *idle]:
                expired.close()
            idle.clear()
            return None
        return connection

    def _release(self, connection: _Connection) -> None:
        if connection.reusable and not self._closed:
            connection.idle_since = connection.loop.time()
            self._idle.setdefault(connection.key, []).append(connection)
            if self._sweep is None:
                self._sweep = connection.loop.call_at(connection.idle_since + self.keepalive_s, self._expire)
            self._wake()
        else:
            connection.close()

    def _expire(self) -> None:
        """Close the connections idle for `keepalive_s`; come back when the next one will be."""
        self._sweep = None
        loop = asyncio.get_running_loop()
        oldest: float | None = None
        for idle in self._idle.values():
            while idle and loop.time() - idle[0].idle_since >= self.keepalive_s:
                idle.pop(0).close()
            if idle:
                oldest = idle[0].idle_since if oldest is None else min(oldest, idle[0].idle_since)
        if oldest is not None and not self._closed:
            self._sweep = loop.call_at(oldest + self.keepalive_s, self._expire)

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
                lambda: _Connection(self, key),
                host,
                port,
                ssl=tls,
                server_hostname=host if tls else None,
                happy_eyeballs_delay=HAPPY_EYEBALLS_DELAY_S,
                interleave=1,
            )
        except (OSError, ssl.SSLError) as exc:  # refused, unreachable, unresolvable, TLS handshake
            raise Failure(CONNECT, f"{type(exc).__name__}: {exc.strerror or exc}") from exc
        self._open.add(connection)
        return connection

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls


def _request(target: Target, content: bytes, headers: dict[str, str]) -> bytes:
    """The request's bytes: head and body in one buffer, for one write."""
    lines = [f"{target.head}Content-Length: {len(content)}"]
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
    return head + content
