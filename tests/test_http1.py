"""`task_app.core.http1`, the keep-alive POST pool, against loopback asyncio servers that write raw
HTTP/1.1 bytes: each test scripts what the server answers on which connection, and the server counts
the connections it accepted, the requests it read and the connections open at once.

(`core.outbound.post` over this pool is covered end to end in test_inference.py, test_proxy.py and
test_model_faults.py.)
"""

from __future__ import annotations

import asyncio
import gc
import ipaddress
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from task_app.core import http1

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]  # loopback asyncio servers in this process

LIMITS = http1.Limits(connect_s=5.0, read_s=5.0, total_s=10.0, max_bytes=10_000, error_bytes=64)


@dataclass
class Request:
    connection: int  # 1 for the server's first accepted connection, 2 for the next...
    head: list[str]  # the request line, then the header lines
    body: bytes

    def header(self, name: str) -> str | None:
        for line in self.head[1:]:
            key, _, value = line.partition(":")
            if key.strip().lower() == name.lower():
                return value.strip()
        return None


# The server's part of one exchange: write (or not) an answer; False closes the connection after it.
Respond = Callable[[Request, asyncio.StreamWriter], Awaitable[bool]]


@dataclass
class Server:
    url: http1.Target
    requests: list[Request] = field(default_factory=list)
    connections: int = 0
    open_now: int = 0
    open_most: int = 0


def answer(body: bytes = b"ok", status: str = "200 OK", extra: str = "") -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def replying(*raw: bytes, keep: bool = True, delay_s: float = 0.0) -> Respond:
    """Write `raw` (in separate writes, `delay_s` apart) for every request."""

    async def respond(request: Request, writer: asyncio.StreamWriter) -> bool:
        for part in raw:
            if delay_s:
                await asyncio.sleep(delay_s)
            writer.write(part)
            await writer.drain()
        return keep

    return respond


@asynccontextmanager
async def serving(respond: Respond, tls: ssl.SSLContext | None = None) -> AsyncIterator[Server]:
    server: Server | None = None

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert server is not None
        server.connections += 1
        number = server.connections
        server.open_now += 1
        server.open_most = max(server.open_most, server.open_now)
        try:
            while True:
                try:
                    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")[:-2]
                    request = Request(number, head, b"")
                    request.body = await reader.readexactly(int(request.header("content-length") or 0))
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                server.requests.append(request)
                if not await respond(request, writer):
                    return
        finally:
            server.open_now -= 1
            writer.close()

    listener = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=tls)
    port = listener.sockets[0].getsockname()[1]
    server = Server(http1.parse(f"{'https' if tls else 'http'}://127.0.0.1:{port}/v1/chat/completions?x=1"))
    async with listener:
        yield server
        listener.close()


@asynccontextmanager
async def pool(max_connections: int = 4, tls: ssl.SSLContext | None = None) -> AsyncIterator[http1.Pool]:
    opened = http1.Pool(max_connections, tls=tls)
    try:
        yield opened
    finally:
        await opened.close()


async def post(p: http1.Pool, server: Server, body: bytes = b"{}", limits: http1.Limits = LIMITS) -> http1.Reply:
    return await p.post(server.url, body, {"Content-Type": "application/json"}, limits)


async def failure(p: http1.Pool, server: Server, limits: http1.Limits = LIMITS) -> http1.Failure:
    with pytest.raises(http1.Failure) as caught:
        await post(p, server, limits=limits)
    return caught.value


# --- keep-alive and retries -----------------------------------------------------------------------


async def test_several_posts_share_one_connection() -> None:
    async def echo(request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(answer(request.body, extra="X-Seen: yes\r\nRetry-After: 3\r\n"))
        return True

    async with serving(echo) as server, pool() as p:
        replies = [await post(p, server, f'{{"n": {n}}}'.encode()) for n in range(3)]
    assert [reply.body for reply in replies] == [b'{"n": 0}', b'{"n": 1}', b'{"n": 2}']
    assert {reply.status for reply in replies} == {200}
    assert replies[0].headers["x-seen"] == "yes" and replies[0].headers["retry-after"] == "3"
    assert server.connections == 1 and len(server.requests) == 3
    first = server.requests[0]
    assert first.head[0] == "POST /v1/chat/completions?x=1 HTTP/1.1"
    assert first.header("host") == f"127.0.0.1:{server.url.port}"
    assert first.header("content-length") == "8" and first.header("content-type") == "application/json"
    assert first.header("user-agent") == http1.USER_AGENT


async def test_a_connection_the_server_closed_while_idle_is_retried_once_on_a_new_one() -> None:
    async def close_the_second_exchange(request: Request, writer: asyncio.StreamWriter) -> bool:
        if len([seen for seen in server.requests if seen.connection == request.connection]) == 2:
            return False  # the keep-alive race: the request arrived as the server gave up on the connection
        writer.write(answer(f"connection {request.connection}".encode()))
        return True

    async with serving(close_the_second_exchange) as server, pool() as p:
        assert (await post(p, server)).body == b"connection 1"
        assert (await post(p, server)).body == b"connection 2"
    assert server.connections == 2 and [r.connection for r in server.requests] == [1, 1, 2]


async def test_no_retry_once_bytes_of_the_answer_arrived() -> None:
    async def cut_the_second_answer(request: Request, writer: asyncio.StreamWriter) -> bool:
        if len(server.requests) == 2:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
            return False
        writer.write(answer())
        return True

    async with serving(cut_the_second_answer) as server, pool() as p:
        await post(p, server)
        assert (await failure(p, server)).kind == http1.TRANSPORT
    assert server.connections == 1 and len(server.requests) == 2


async def test_a_new_connection_that_fails_is_not_retried() -> None:
    async with serving(replying(keep=False)) as server, pool() as p:
        assert (await failure(p, server)).kind == http1.TRANSPORT
    assert server.connections == 1


async def test_a_refused_connection_is_a_connect_failure() -> None:
    async with serving(replying(answer())) as server:
        url = server.url
    async with pool() as p:
        with pytest.raises(http1.Failure) as caught:
            await p.post(url, b"{}", {}, LIMITS)
    assert caught.value.kind == http1.CONNECT


# --- the connection limit ---------------------------------------------------------------------------


async def test_max_connections_holds_under_concurrency() -> None:
    async with serving(replying(answer(), delay_s=0.05)) as server, pool(max_connections=2) as p:
        replies = await asyncio.gather(*(post(p, server) for _ in range(8)))
    assert [reply.status for reply in replies] == [200] * 8
    assert server.open_most == 2 and server.connections == 2 and len(server.requests) == 8


@pytest.mark.parametrize(
    "limits",
    [http1.Limits(0.2, 5.0, 10.0, 10_000, 64), http1.Limits(5.0, 5.0, 0.2, 10_000, 64)],
    ids=["connect_s", "total_s"],
)
async def test_waiting_for_a_free_connection_is_bounded(limits: http1.Limits) -> None:
    async with serving(replying(answer(), delay_s=1.0)) as server, pool(max_connections=1) as p:
        held = asyncio.create_task(post(p, server))
        await asyncio.sleep(0.05)
        started = time.monotonic()
        waited = await failure(p, server, limits)
        assert waited.kind == http1.TIMEOUT and time.monotonic() - started < 0.9
        assert (await held).status == 200
    assert server.connections == 1


async def test_closing_the_pool_fails_a_post_waiting_for_a_connection() -> None:
    async with serving(replying(answer(), delay_s=1.0)) as server, pool(max_connections=1) as p:
        held = asyncio.create_task(post(p, server))
        await asyncio.sleep(0.05)
        waiting = asyncio.create_task(post(p, server))
        await asyncio.sleep(0.05)
        await p.close()
        for task in (held, waiting):
            with pytest.raises(http1.Failure) as caught:
                await task
            assert caught.value.kind == http1.TRANSPORT
    assert server.connections == 1


# --- framing ----------------------------------------------------------------------------------------


async def test_a_chunked_answer_is_joined_and_the_connection_kept() -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"5\r\nhello\r\n",
        b"6\r\n world\r\n",
        b"0\r\n\r\n",
    )
    async with serving(replying(*chunked, delay_s=0.01)) as server, pool() as p:
        assert (await post(p, server)).body == b"hello world"
        assert (await post(p, server)).body == b"hello world"
    assert server.connections == 1


async def test_an_answer_framed_by_closing_the_connection() -> None:
    async with serving(replying(b"HTTP/1.1 200 OK\r\n\r\n", b"until ", b"the end", keep=False)) as server, pool() as p:
        assert (await post(p, server)).body == b"until the end"
        assert (await post(p, server)).body == b"until the end"
    assert server.connections == 2


async def test_informational_answers_are_skipped() -> None:
    early = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
    async with serving(replying(early, answer(b"real", extra="X-Real: 1\r\n"))) as server, pool() as p:
        reply = await post(p, server)
        assert (reply.status, reply.body, reply.headers.get("x-real")) == (200, b"real", "1")
        assert "link" not in reply.headers
        assert (await post(p, server)).body == b"real"
    assert server.connections == 1


async def test_a_second_answer_to_one_request_drops_the_connection() -> None:
    async with serving(replying(answer(b"one") + answer(b"two"))) as server, pool() as p:
        assert (await post(p, server)).body == b"one"
        assert (await post(p, server)).body == b"one"
    assert server.connections == 2


async def test_broken_http_is_a_transport_failure() -> None:
    async with serving(replying(b"HTTP/1.1 2xx nonsense\r\n\r\n")) as server, pool() as p:
        assert (await failure(p, server)).kind == http1.TRANSPORT


# --- time limits ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parts", "delay_s", "limits", "says", "at_least_s"),
    [
        (  # a byte every 20 ms: no read is late, the whole answer is
            (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", *(b"x" for _ in range(100))),
            0.02,
            http1.Limits(connect_s=1.0, read_s=0.5, total_s=0.3, max_bytes=10_000, error_bytes=64),
            "within 0.3 s",
            0.25,
        ),
        (  # the head, then silence
            (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nab", b"cd"),
            0.5,
            http1.Limits(connect_s=1.0, read_s=0.2, total_s=5.0, max_bytes=10_000, error_bytes=64),
            "nothing read for 0.2 s",
            0.15,
        ),
    ],
    ids=["total", "read"],
)
async def test_time_limits(
    parts: tuple[bytes, ...], delay_s: float, limits: http1.Limits, says: str, at_least_s: float
) -> None:
    async with serving(replying(*parts, delay_s=delay_s)) as server, pool() as p:
        started = time.monotonic()
        failed = await failure(p, server, limits)
    assert failed.kind == http1.TIMEOUT and says in str(failed)
    assert at_least_s < time.monotonic() - started < 1.5


async def test_reads_that_keep_coming_reset_the_read_limit() -> None:
    drip = (b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n", *(b"x" for _ in range(6)))
    limits = http1.Limits(connect_s=1.0, read_s=0.25, total_s=5.0, max_bytes=10_000, error_bytes=64)
    async with serving(replying(*drip, delay_s=0.1)) as server, pool() as p:
        assert (await post(p, server, limits=limits)).body == b"xxxxxx"


# --- size limits ------------------------------------------------------------------------------------


async def test_a_2xx_longer_than_max_bytes_by_content_length_is_refused() -> None:
    limits = http1.Limits(1.0, 1.0, 5.0, max_bytes=100, error_bytes=64)
    async with serving(replying(answer(b"x" * 101))) as server, pool() as p:
        with pytest.raises(http1.TooLarge) as caught:
            await post(p, server, limits=limits)
        assert (caught.value.limit, caught.value.declared) == (100, 101)
        assert (await post(p, server)).body == b"x" * 101  # a new connection: the refused one is gone
    assert server.connections == 2


async def test_a_2xx_that_grows_past_max_bytes_while_read_is_refused() -> None:
    chunk = b"40\r\n" + b"y" * 64 + b"\r\n"
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", chunk, chunk, b"0\r\n\r\n")
    limits = http1.Limits(1.0, 1.0, 5.0, max_bytes=100, error_bytes=64)
    async with serving(replying(*chunked, delay_s=0.01)) as server, pool() as p:
        with pytest.raises(http1.TooLarge) as caught:
            await post(p, server, limits=limits)
    assert (caught.value.limit, caught.value.declared) == (100, None)


async def test_a_lost_connection_and_what_it_read_are_freed_without_the_cycle_collector() -> None:
    """The parser and its protocol refer to each other: a refused answer's bytes stayed in memory until
    the next full collection (benchmarks/ soak: most of a 1.2 GB plateau)."""
    chunk = b"40\r\n" + b"y" * 64 + b"\r\n"
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", chunk, chunk, b"0\r\n\r\n")
    limits = http1.Limits(1.0, 1.0, 5.0, max_bytes=100, error_bytes=64)
    gc.collect()
    gc.disable()
    try:
        async with serving(replying(*chunked, delay_s=0.01)) as server, pool() as p:
            with pytest.raises(http1.TooLarge):
                await post(p, server, limits=limits)
            for _ in range(3):  # the transport's connection_lost runs in a later loop iteration
                await asyncio.sleep(0)
            assert not [o for o in gc.get_objects() if isinstance(o, http1._Connection)]
    finally:
        gc.enable()


async def test_an_error_body_is_cut_at_error_bytes() -> None:
    body = bytes(range(256)) * 4
    async with serving(replying(answer(body, status="500 Internal Server Error"))) as server, pool() as p:
        reply = await post(p, server)
        assert (reply.status, reply.body) == (500, body[:64])
        assert (await post(p, server)).status == 500
    assert server.connections == 2  # the rest of a cut body is not read: that connection is closed


async def test_an_error_body_within_error_bytes_keeps_the_connection() -> None:
    async with serving(replying(answer(b'{"error": "no"}', status="429 Too Many Requests"))) as server, pool() as p:
        assert (await post(p, server)).body == b'{"error": "no"}'
        assert (await post(p, server)).status == 429
    assert server.connections == 1


# --- the request ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [{"X-Evil": "a\r\nInjected: yes"}, {"X-Evil": "a\nb"}, {"X-Evil\r\nInjected": "yes"}, {"X-Nul": "a\0"}],
)
async def test_a_header_with_a_line_break_is_refused_before_connecting(headers: dict[str, str]) -> None:
    async with serving(replying(answer())) as server, pool() as p:
        with pytest.raises(http1.Failure) as caught:
            await p.post(server.url, b"{}", headers, LIMITS)
    assert caught.value.kind == http1.REQUEST and server.connections == 0


async def test_a_header_that_is_not_latin1_is_refused() -> None:
    async with serving(replying(answer())) as server, pool() as p:
        with pytest.raises(http1.Failure) as caught:
            await p.post(server.url, b"{}", {"Authorization": "Bearer ключ"}, LIMITS)
    assert caught.value.kind == http1.REQUEST and "ключ" not in str(caught.value)


# --- TLS --------------------------------------------------------------------------------------------


def self_signed(directory: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server context, client context trusting only this certificate) for 127.0.0.1."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "task-app test")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    (directory / "cert.pem").write_bytes(pem)
    (directory / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(directory / "cert.pem", directory / "key.pem")
    client = ssl.create_default_context(cadata=pem.decode())
    return server, client


async def test_https_with_keep_alive(tmp_path: Path) -> None:
    server_tls, client_tls = self_signed(tmp_path)

    async def echo(request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(answer(request.body))
        return True

    async with serving(echo, tls=server_tls) as server, pool(tls=client_tls) as p:
        assert server.url.scheme == "https"
        assert (await post(p, server, b"secret one")).body == b"secret one"
        assert (await post(p, server, b"secret two")).body == b"secret two"
    assert server.connections == 1


async def test_https_to_an_untrusted_certificate_is_a_connect_failure(tmp_path: Path) -> None:
    server_tls, _ = self_signed(tmp_path)
    async with serving(replying(answer()), tls=server_tls) as server, pool() as p:  # the system's trust store
        failed = await failure(p, server)
    assert failed.kind == http1.CONNECT and "CERTIFICATE_VERIFY_FAILED" in str(failed)
    assert server.requests == []


# --- connecting: Happy Eyeballs, connect timeout ------------------------------------------------------


@contextmanager
def blackhole() -> Iterator[tuple[str, int]]:
    """A loopback address whose connects hang, as an unreachable host's do: a listener that never
    accepts, its backlog filled (further SYNs are dropped)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    address = listener.getsockname()
    held: list[socket.socket] = []
    try:
        while True:
            client = socket.socket()
            client.settimeout(0.2)
            try:
                client.connect(address)
            except TimeoutError:
                client.close()
                break
            held.append(client)
        yield address
    finally:
        for client in held:
            client.close()
        listener.close()


def resolving(monkeypatch: pytest.MonkeyPatch, name: str, *addresses: tuple[str, int]) -> None:
    """`name` resolves to `addresses` (IPv4 socket addresses), in this order, on the running loop: a
    stand-in for DNS, which no test may touch (the ports let two loopback listeners be two hosts)."""
    loop = asyncio.get_running_loop()
    real = loop.getaddrinfo

    async def getaddrinfo(host: Any, port: Any, **kwargs: Any) -> list[Any]:
        if host != name:
            return await real(host, port, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", address) for address in addresses]

    monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)


async def test_happy_eyeballs_moves_on_from_an_address_that_does_not_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first address hangs; the second is tried after HAPPY_EYEBALLS_DELAY_S, not after the connect
    timeout (which would fail the call: one address at a time, the whole 5 s go to the first)."""
    async with serving(replying(answer(b"second address"))) as server, pool() as p:
        with blackhole() as hanging:
            resolving(monkeypatch, "two-addresses.test", hanging, ("127.0.0.1", server.url.port))
            target = http1.parse(f"http://two-addresses.test:{server.url.port}/v1/chat/completions")
            started = time.monotonic()
            reply = await p.post(target, b"{}", {}, LIMITS)
            took = time.monotonic() - started
    assert reply.body == b"second address" and server.connections == 1
    assert server.requests[0].header("host") == f"two-addresses.test:{server.url.port}"
    assert http1.HAPPY_EYEBALLS_DELAY_S <= took < LIMITS.connect_s / 2


async def test_connecting_to_an_address_that_does_not_answer_is_bounded_by_connect_s() -> None:
    limits = http1.Limits(connect_s=0.3, read_s=5.0, total_s=10.0, max_bytes=10_000, error_bytes=64)
    with blackhole() as (host, port):
        async with pool() as p:
            started = time.monotonic()
            with pytest.raises(http1.Failure) as caught:
                await p.post(http1.parse(f"http://{host}:{port}/"), b"{}", {}, limits)
    assert caught.value.kind == http1.TIMEOUT and 0.25 < time.monotonic() - started < 2.0


# --- idle expiry --------------------------------------------------------------------------------------


async def test_an_idle_connection_is_closed_after_keepalive_s() -> None:
    async with serving(replying(answer())) as server, pool() as p:
        p.keepalive_s = 0.2
        await post(p, server)
        assert (p.open, p.idle, server.open_now) == (1, 1, 1)
        await asyncio.sleep(0.1)
        await post(p, server)  # reused: idle for less than keepalive_s
        assert server.connections == 1
        await asyncio.sleep(0.5)  # the sweep closes it without waiting for another request
        assert (p.open, p.idle, server.open_now) == (0, 0, 0)
        await post(p, server)
    assert server.connections == 2


async def test_an_expired_connection_is_not_reused_even_before_the_sweep() -> None:
    async with serving(replying(answer())) as server, pool() as p:
        await post(p, server)
        p.keepalive_s = 0.0  # expired at once; the sweep is scheduled for the old keepalive_s
        await post(p, server)
    assert server.connections == 2


# --- large bodies -------------------------------------------------------------------------------------


async def test_large_request_and_answer_bodies_arrive_whole() -> None:
    async def echo(request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(answer(request.body[::-1]))
        await writer.drain()
        return True

    content = bytes(range(256)) * (16 * 1024)  # 4 MiB
    limits = http1.Limits(5.0, 5.0, 20.0, max_bytes=len(content), error_bytes=64)
    async with serving(echo) as server, pool() as p:
        for _ in range(2):
            assert (await post(p, server, content, limits)).body == content[::-1]
    assert server.connections == 1


# --- streams ------------------------------------------------------------------------------------------


async def read_all(streamed: http1.Streamed) -> list[bytes]:
    chunks = []
    while (chunk := await streamed.next_chunk()) is not None:
        chunks.append(chunk)
    return chunks


async def stream(p: http1.Pool, server: Server, limits: http1.Limits = LIMITS) -> http1.Streamed:
    return await p.stream(server.url, b"{}", {"Accept": "text/event-stream"}, limits)


async def test_a_stream_yields_chunks_as_they_arrive_and_keeps_the_connection() -> None:
    second = asyncio.Event()

    async def events(request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(b"7\r\ndata: 1\r\n")
        await writer.drain()
        await second.wait()  # the test has read the first event before the second is sent
        second.clear()
        writer.write(b"7\r\ndata: 2\r\n0\r\n\r\n")
        return True

    async with serving(events) as server, pool() as p:
        for _ in range(2):
            streamed = await stream(p, server)
            assert streamed.status == 200 and streamed.headers["content-type"] == "text/event-stream"
            assert await streamed.next_chunk() == b"data: 1"
            second.set()
            assert b"".join(await read_all(streamed)) == b"data: 2"
            streamed.close()
            streamed.close()  # idempotent
    assert server.connections == 1 and len(server.requests) == 2


async def test_a_stream_closed_before_its_end_drops_the_connection() -> None:
    async with serving(replying(answer(b"x" * 100), delay_s=0.01)) as server, pool() as p:
        streamed = await stream(p, server)
        streamed.close()
        assert (await post(p, server)).body == b"x" * 100
    assert server.connections == 2


async def test_a_stream_that_breaks_off_is_a_transport_failure() -> None:
    cut = (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", b"data: partial\n\n")
    async with serving(replying(*cut, keep=False, delay_s=0.01)) as server, pool() as p:
        streamed = await stream(p, server)
        with pytest.raises(http1.Failure) as caught:
            await read_all(streamed)
        streamed.close()
    assert caught.value.kind == http1.TRANSPORT


HEAD_CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    ("chunks", "limits", "says"),
    [
        (  # three events, then silence
            3,
            http1.Limits(connect_s=1.0, read_s=0.2, total_s=5.0, max_bytes=0, error_bytes=0),
            "nothing read for 0.2 s",
        ),
        (  # an event every 50 ms: no read is late, the whole stream is
            100,
            http1.Limits(connect_s=1.0, read_s=5.0, total_s=0.3, max_bytes=0, error_bytes=0),
            "within 0.3 s",
        ),
    ],
    ids=["read", "total"],
)
async def test_a_stream_body_is_bounded_by_read_s_and_total_s(chunks: int, limits: http1.Limits, says: str) -> None:
    drip = (HEAD_CHUNKED, *(b"1\r\nx\r\n" for _ in range(chunks)))
    async with serving(replying(*drip, delay_s=0.05)) as server, pool() as p:
        streamed = await stream(p, server, limits)
        with pytest.raises(http1.Failure) as caught:
            await read_all(streamed)
        streamed.close()
    assert caught.value.kind == http1.TIMEOUT and says in str(caught.value)


async def test_a_slow_reader_pauses_the_server_without_timing_out() -> None:
    """Unread bytes are bounded: past a high-water mark the socket is not read, so the server's writes
    wait; the reader's own slowness never counts as the server's silence (read_s)."""
    body = bytes(range(256)) * (64 * 1024)  # 16 MiB, more than the loopback socket buffers hold
    written = asyncio.Event()

    async def large(request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()
        written.set()
        return True

    limits = http1.Limits(connect_s=1.0, read_s=0.2, total_s=10.0, max_bytes=0, error_bytes=0)
    async with serving(large) as server, pool() as p:
        streamed = await stream(p, server, limits)
        first = await streamed.next_chunk()
        await asyncio.sleep(0.6)  # three read limits long
        assert not written.is_set()  # the server is held back
        rest = await read_all(streamed)
        streamed.close()
        assert written.is_set()
        assert (first or b"") + b"".join(rest) == body
        again = await stream(p, server, limits)
        assert len(b"".join(await read_all(again))) == len(body)
        again.close()
    assert server.connections == 1  # a stream read to its end gives its connection back
