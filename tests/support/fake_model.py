"""A scriptable OpenAI-compatible model server on loopback, for tests that need real HTTP.

    with FakeModel() as model:                       # real uvicorn, 127.0.0.1, OS-assigned port
        model.script(error(500), tool_call("move_right", "do"))
        ... POST model.url("/v1/chat/completions") ...
        model.requests[-1].headers["authorization"]

Each request takes the next scripted behaviour; when the script is empty, `model.default` answers
(a `noop` tool call unless changed), or `model.responder(record)` if set. Behaviours: `tool_call`,
`text`, `chat` (any assistant message), `aborted` (vLLM's answer to a request a weight update's
pause cut), `json_body`, `raw` (e.g. malformed JSON), `error` (any
status, optional Retry-After), `delay(seconds, then)`, `gated(event)` (answer once a test thread sets
it), `hang()`, `huge(n_bytes)` (streamed), `drop()` (close the connection without answering) and
`sse(events)` (a `stream: true` answer: server-sent `chat.completion.chunk` events, see `chunk`).

Token modes (`model.tokens = "vllm" | "sglang" | "openai"`): answers of `chat`, `tool_call` and `text`
carry token data as that server documents it, for what the request asked (`logprobs`, `top_logprobs`,
vLLM's `return_token_ids` / `return_tokens_as_token_ids`, SGLang's `return_prompt_token_ids`); the
"openai" mode refuses vLLM's fields with a 400, as OpenAI does. The stand-in tokenizer (`fake_ids`)
cuts the prompt (the JSON of the messages) and the completion into 4-character pieces. Every answer
a `chat` behaviour sends is kept in `model.answers`; `model.answer_headers` go with each of them.

Chat templates (`model.template = "reasoning" | "no-reasoning"`, with a token mode): the prompt ids are
rendered message by message (`template_prompt_ids`), and the completion ids are the answer as the
template renders an assistant message (reasoning first, as `<think>...</think>`) plus `<|im_end|>`, so
a conversation that sends answers back as given extends its previous prompt token for token; the
"no-reasoning" template drops earlier answers' reasoning, which breaks that.

conftest.py's fixtures: `fake_model_server` (one server per session) and `fake_model` (the same server,
reset for each test).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import threading
import time
import zlib
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.lowlevel
import uvicorn
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

START_TIMEOUT_S = 10.0
HANG_LIMIT_S = 60.0  # a hung request gives up by itself eventually, so teardown never waits forever
DEFAULT_USAGE = {"prompt_tokens": 120, "completion_tokens": 12, "total_tokens": 132}


@dataclass(frozen=True)
class Recorded:
    """One request as the fake server received it."""

    method: str
    path: str
    query: str
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    raw: bytes

    @property
    def body(self) -> Any:
        try:
            return json.loads(self.raw)
        except ValueError:
            return None

    @property
    def target(self) -> str:
        return self.path + (f"?{self.query}" if self.query else "")


@dataclass
class Exchange:
    """What a behaviour gets to answer one request."""

    record: Recorded
    scope: Scope
    receive: Receive
    send: Send
    stopping: threading.Event
    stats: dict[str, int]
    tokens: str | None = None  # the token mode of the server (see the module docstring)
    answers: list[dict[str, Any]] | None = None  # the server's log of chat answers
    answer_headers: dict[str, str] | None = None  # headers every chat answer carries (e.g. X-Policy-Version)
    template: str | None = None  # the chat template of the token modes (see the module docstring)


Behaviour = Callable[[Exchange], Awaitable[None]]
TOKEN_MODES = ("vllm", "sglang", "openai")
PIECE_CHARS = 4
VOCAB = 151_936  # a Qwen-sized vocabulary
VLLM_ONLY_FIELDS = ("return_token_ids", "return_tokens_as_token_ids", "return_prompt_token_ids")
IM_START, IM_END = 151644, 151645  # the stand-in template's special tokens (Qwen's ids)
TEMPLATES = ("reasoning", "no-reasoning")
_ids = itertools.count(1)


def completion(
    message: dict[str, Any],
    *,
    finish_reason: str = "stop",
    model: str = "fake-model",
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A chat.completion body around one assistant message."""
    return {
        "id": f"chatcmpl-fake-{next(_ids)}",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": DEFAULT_USAGE if usage is None else usage,
    }


def _model_of(record: Recorded) -> str:
    body = record.body
    return str(body.get("model", "fake-model")) if isinstance(body, dict) else "fake-model"


def pieces(text: str) -> list[str]:
    """The stand-in tokenizer's pieces of `text`: 4 characters each."""
    return [text[index : index + PIECE_CHARS] for index in range(0, len(text), PIECE_CHARS)]


def fake_ids(text: str) -> list[int]:
    """The stand-in tokenizer's ids of `text` (stable: a CRC of each piece)."""
    return [zlib.crc32(piece.encode()) % VOCAB for piece in pieces(text)]


def fake_logprob(token_id: int) -> float:
    return -round(0.05 + (token_id % 97) / 100, 4)


def completion_text(message: dict[str, Any]) -> str:
    """What the stand-in model 'generated' for `message`: its text, then its tool calls as JSON."""
    content = message.get("content") if isinstance(message.get("content"), str) else ""
    calls = message.get("tool_calls")
    return content + (json.dumps(calls) if calls else "")


def _segment(role: str, body: list[int]) -> list[int]:
    return [IM_START, *fake_ids(role + "\n"), *body, IM_END]


def assistant_ids(message: dict[str, Any], *, reasoning: bool = True) -> list[int]:
    """An assistant message as the chat template renders it, and as the stand-in model generates it:
    `<think>reasoning</think>` (with `reasoning`), the content, each tool call as `<tool_call>{json}</tool_call>`."""
    thought = message.get("reasoning_content", message.get("reasoning"))
    text = f"<think>{thought}</think>" if reasoning and isinstance(thought, str) else ""
    text += message["content"] if isinstance(message.get("content"), str) else ""
    for call in message.get("tool_calls") or []:
        function = call["function"]
        arguments = function["arguments"]
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        text += "<tool_call>" + json.dumps({"name": function["name"], "arguments": parsed}) + "</tool_call>"
    return fake_ids(text)


def template_prompt_ids(request: dict[str, Any], template: str) -> list[int]:
    """The prompt ids of a chat template (`TEMPLATES`): each message `<|im_start|>role\n body <|im_end|>`, the
    tools after the system text, then the generation prompt. "reasoning" renders earlier answers' reasoning
    back, "no-reasoning" drops it (as templates that strip earlier thinking do)."""
    ids: list[int] = []
    for message in request.get("messages") or []:
        role = str(message.get("role"))
        if role == "assistant":
            ids += _segment(role, assistant_ids(message, reasoning=template == "reasoning"))
            continue
        content = message.get("content")
        text = content if isinstance(content, str) else json.dumps(content)
        if role == "system" and request.get("tools"):
            text += json.dumps(request["tools"])
        ids += _segment(role, fake_ids(text))
    return [*ids, IM_START, *fake_ids("assistant\n")]


def add_tokens(body: dict[str, Any], request: Any, mode: str, template: str | None = None) -> None:
    """Put token data into `body` as server `mode` would for `request` (rendered by `template`, if any)."""
    request = request if isinstance(request, dict) else {}
    choice = body["choices"][0]
    if template is None:
        prompt_ids = fake_ids(json.dumps(request.get("messages")))
        generated = completion_text(choice["message"])
        ids, texts = fake_ids(generated), pieces(generated)
    else:
        prompt_ids = template_prompt_ids(request, template)
        ids = [*assistant_ids(choice["message"]), IM_END]
        texts = [f"<{token_id}>" for token_id in ids]
    if request.get("logprobs"):
        spelled = mode == "vllm" and request.get("return_tokens_as_token_ids")
        choice["logprobs"] = {
            "content": [
                {
                    "token": f"token_id:{token_id}" if spelled else piece,
                    "logprob": fake_logprob(token_id),
                    "bytes": list(piece.encode()),
                    "top_logprobs": [],
                }
                for piece, token_id in zip(texts, ids, strict=True)
            ]
        }
    if mode in ("vllm", "sglang") and request.get("return_token_ids"):
        choice["token_ids"] = ids
    if mode == "vllm" and request.get("return_token_ids"):
        body["prompt_token_ids"] = prompt_ids
    if mode == "sglang" and request.get("return_prompt_token_ids"):
        choice["prompt_token_ids"] = prompt_ids
    body["usage"] = {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": len(ids),
        "total_tokens": len(prompt_ids) + len(ids),
    }


def chat(
    message: dict[str, Any],
    *,
    finish_reason: str = "stop",
    usage: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> Behaviour:
    """An answer of one assistant message; `headers` go with it (over `model.answer_headers`)."""

    async def respond(ex: Exchange) -> None:
        body = completion(message, finish_reason=finish_reason, model=_model_of(ex.record), usage=usage)
        request = ex.record.body
        if ex.tokens == "openai" and isinstance(request, dict):
            foreign = [name for name in VLLM_ONLY_FIELDS if name in request]
            if foreign:
                refusal = {
                    "message": f"Unrecognized request argument supplied: {foreign[0]}",
                    "type": "invalid_request_error",
                }
                await JSONResponse({"error": refusal}, status_code=400)(ex.scope, ex.receive, ex.send)
                return
        if ex.tokens is not None:
            add_tokens(body, request, ex.tokens, ex.template)
        if ex.answers is not None:
            ex.answers.append(body)
        sent = {**(ex.answer_headers or {}), **(headers or {})}
        await JSONResponse(body, headers=sent or None)(ex.scope, ex.receive, ex.send)

    return respond


def tool_call(
    *actions: Any,
    name: str = "interact_many",
    arguments: Any = None,
    as_string: bool = True,
    content: str | None = None,
    headers: dict[str, str] | None = None,
    reasoning: str | None = None,
    reasoning_field: str = "reasoning_content",
) -> Behaviour:
    """An assistant message with one tool call; `arguments` overrides the default `{"actions": [...]}`;
    `reasoning` goes in `reasoning_field` (vLLM's `reasoning_content`, or `reasoning`)."""
    args = {"actions": list(actions)} if arguments is None else arguments
    call = {
        "id": f"call_{next(_ids)}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args) if as_string else args},
    }
    message: dict[str, Any] = {"role": "assistant", "content": content, "tool_calls": [call]}
    if reasoning is not None:
        message[reasoning_field] = reasoning
    return chat(message, finish_reason="tool_calls", headers=headers)


def text(content: str, *, finish_reason: str = "stop") -> Behaviour:
    return chat({"role": "assistant", "content": content}, finish_reason=finish_reason)


def aborted() -> Behaviour:
    """What vLLM answers for a request its `pause_generation(mode="abort")` cut: `finish_reason: "abort"`."""
    return chat({"role": "assistant", "content": ""}, finish_reason="abort")


def json_body(body: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> Behaviour:
    async def respond(ex: Exchange) -> None:
        await JSONResponse(body, status_code=status, headers=headers)(ex.scope, ex.receive, ex.send)

    return respond


def raw(
    content: bytes | str,
    *,
    status: int = 200,
    content_type: str = "application/json",
    headers: dict[str, str] | None = None,
) -> Behaviour:
    async def respond(ex: Exchange) -> None:
        response = Response(content, status_code=status, media_type=content_type, headers=headers)
        await response(ex.scope, ex.receive, ex.send)

    return respond


def error(
    status: int, *, retry_after: str | float | None = None, body: Any = None, headers: dict[str, str] | None = None
) -> Behaviour:
    sent = {**(headers or {}), **({"Retry-After": str(retry_after)} if retry_after is not None else {})}
    payload = body if body is not None else {"error": {"message": f"fake error {status}", "type": "fake_error"}}
    return json_body(payload, status=status, headers=sent or None)


def delay(seconds: float, then: Behaviour | None = None) -> Behaviour:
    async def respond(ex: Exchange) -> None:
        await anyio.sleep(seconds)
        await (then or tool_call("noop"))(ex)

    return respond


def gated(gate: threading.Event, then: Behaviour | None = None) -> Behaviour:
    """Answer (with a `noop` call unless `then`) once `gate` is set: a model that is as slow as the test wants."""

    async def respond(ex: Exchange) -> None:
        with anyio.move_on_after(HANG_LIMIT_S):
            # a threading.Event set by the test thread: poll it (an anyio.Event cannot be set from there)
            while not gate.is_set() and not ex.stopping.is_set():  # noqa: ASYNC110
                await anyio.sleep(0.005)
        await (then or tool_call("noop"))(ex)

    return respond


def hang() -> Behaviour:
    """Never answer: wait until the client goes away (or the server stops)."""

    async def respond(ex: Exchange) -> None:
        with anyio.move_on_after(HANG_LIMIT_S):
            while not ex.stopping.is_set():
                with anyio.move_on_after(0.05):
                    if (await ex.receive())["type"] == "http.disconnect":
                        return
        await error(503)(ex)  # the server is stopping (or the hang limit passed): answer something

    return respond


def huge(
    total_bytes: int,
    *,
    declare_length: bool = False,
    chunk_size: int = 64 * 1024,
    head: bytes = b'{"choices": [{"message": {"role": "assistant", "content": "',
    unit: bytes = b"x",
    tail: bytes = b'"}}]}',
) -> Behaviour:
    """A valid-looking JSON answer of about `total_bytes`: `head`, `unit` repeated, `tail`, streamed in
    chunks (Content-Length optional). E.g. a head that opens a logprobs list and a unit that is one entry.

    Streaming stops as soon as the client disconnects, so a client that gives up early is visible
    (`model.stats["huge_bytes_sent"]`) and the server does not write into a closed socket.
    """
    units_per_chunk = max(1, chunk_size // len(unit))
    chunk_size = units_per_chunk * len(unit)
    filler = max(0, total_bytes - len(head) - len(tail)) // len(unit) * len(unit)

    async def respond(ex: Exchange) -> None:
        headers = [(b"content-type", b"application/json")]
        if declare_length:
            headers.append((b"content-length", str(len(head) + filler + len(tail)).encode()))
        gone = anyio.Event()

        async def watch() -> None:
            while (await ex.receive())["type"] != "http.disconnect":
                pass
            gone.set()

        def pieces() -> Iterator[bytes]:
            yield head
            left = filler
            while left > 0:
                size = min(chunk_size, left)
                left -= size
                yield unit * (size // len(unit))
            yield tail

        sent = 0
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(watch)
            await ex.send({"type": "http.response.start", "status": 200, "headers": headers})
            for piece in pieces():
                if gone.is_set() or ex.stopping.is_set():
                    break
                await ex.send({"type": "http.response.body", "body": piece, "more_body": True})
                sent += len(piece)
                await anyio.lowlevel.checkpoint()  # let `watch` notice a disconnect
            else:
                await ex.send({"type": "http.response.body", "body": b"", "more_body": False})
            ex.stats["huge_bytes_sent"] = sent
            tasks.cancel_scope.cancel()

    return respond


def chunk(content: str | None = None, *, finish_reason: str | None = None, model: str = "fake-model") -> dict[str, Any]:
    """One `chat.completion.chunk` of a streamed answer (the role comes with the first content)."""
    delta = {"role": "assistant", "content": content} if content is not None else {}
    return {
        "id": "chatcmpl-fake-stream",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def sse(events: list[Any], *, interval_s: float = 0.0, done: bool = True, then_hang: bool = False) -> Behaviour:
    """A streamed answer: each event as `data: <json>` (bytes sent as they are), then `data: [DONE]`.

    `then_hang` keeps the connection open, silent, after the events. Sending stops when the client
    disconnects: `stats["sse_events_sent"]` counts what went out, `stats["sse_client_gone"]` is 1
    once the client went away (a proxy that drops its client must close this connection too).
    """

    async def respond(ex: Exchange) -> None:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
        gone = anyio.Event()

        async def watch() -> None:
            while (await ex.receive())["type"] != "http.disconnect":
                pass
            gone.set()
            ex.stats["sse_client_gone"] = 1

        frames = [
            event if isinstance(event, bytes) else b"data: " + json.dumps(event).encode() + b"\n\n" for event in events
        ]
        if done:
            frames.append(b"data: [DONE]\n\n")
        ex.stats["sse_events_sent"] = 0
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(watch)
            await ex.send({"type": "http.response.start", "status": 200, "headers": headers})
            for frame in frames:
                if gone.is_set() or ex.stopping.is_set():
                    break
                await ex.send({"type": "http.response.body", "body": frame, "more_body": True})
                ex.stats["sse_events_sent"] += 1
                await anyio.sleep(interval_s)  # also lets `watch` notice a disconnect
            if then_hang:
                with anyio.move_on_after(HANG_LIMIT_S):  # the server's shutdown cancels it sooner
                    await gone.wait()
            if not gone.is_set():
                await ex.send({"type": "http.response.body", "body": b"", "more_body": False})
            tasks.cancel_scope.cancel()

    return respond


def drop() -> Behaviour:
    """Close the TCP connection without sending any response."""

    async def respond(ex: Exchange) -> None:
        transport = getattr(getattr(ex.send, "__self__", None), "transport", None)
        if transport is None:  # pragma: no cover - uvicorn's h11 cycle always has one
            raise RuntimeError("cannot reach the connection's transport to drop it")
        transport.close()

    return respond


class FakeModel:
    """The fake model server. Thread-safe: the test thread scripts, the server thread answers."""

    def __init__(self) -> None:
        self.default: Behaviour = tool_call("noop")
        self.responder: Callable[[Recorded], Behaviour] | None = None
        self._script: deque[Behaviour] = deque()
        self._records: list[Recorded] = []
        self.stats: dict[str, int] = {}  # e.g. huge_bytes_sent: what the last `huge` answer managed to send
        self.tokens: str | None = None  # token mode: "vllm" | "sglang" | "openai" (module docstring)
        self.template: str | None = None  # token modes' chat template: "reasoning" | "no-reasoning" | None
        self.answers: list[dict[str, Any]] = []  # every answer a `chat` behaviour sent
        self.answer_headers: dict[str, str] = {}  # sent with every `chat` answer, e.g. {"X-Policy-Version": "3"}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # --- scripting -------------------------------------------------------------------------------

    def script(self, *behaviours: Behaviour) -> FakeModel:
        with self._lock:
            self._script.extend(behaviours)
        return self

    def reset(self) -> None:
        with self._lock:
            self._script.clear()
            self._records.clear()
            self.stats.clear()
            self.answers.clear()
        self.default = tool_call("noop")
        self.tokens = None
        self.template = None
        self.responder = None
        self.answer_headers = {}

    @property
    def requests(self) -> list[Recorded]:
        with self._lock:
            return list(self._records)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str = "/v1/chat/completions") -> str:
        return self.base_url + path

    def _next(self, record: Recorded) -> Behaviour:
        with self._lock:
            self._records.append(record)
            if self._script:
                return self._script.popleft()
        return self.responder(record) if self.responder is not None else self.default

    # --- ASGI ------------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        headers: dict[str, str] = {}
        for name, value in scope["headers"]:
            key = name.decode("latin-1").lower()
            headers[key] = f"{headers[key]}, {value.decode('latin-1')}" if key in headers else value.decode("latin-1")
        record = Recorded(
            method=scope["method"],
            path=scope["path"],
            query=scope.get("query_string", b"").decode("latin-1"),
            headers=headers,
            raw=b"".join(chunks),
        )
        exchange = Exchange(
            record,
            scope,
            receive,
            send,
            self._stopping,
            self.stats,
            self.tokens,
            self.answers,
            self.answer_headers,
            self.template,
        )
        await self._next(record)(exchange)

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> FakeModel:
        config = uvicorn.Config(
            self,
            http="h11",
            lifespan="off",
            log_config=None,
            log_level="warning",
            access_log=False,
            interface="asgi3",
            timeout_graceful_shutdown=2,
        )
        server = _ThreadServer(config)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._stopping.clear()
        self._server = server
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="fake-model")
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the fake model server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=START_TIMEOUT_S)
            if self._thread.is_alive() and self._server is not None:
                self._server.force_exit = True
                self._thread.join(timeout=START_TIMEOUT_S)
        self._server, self._thread = None, None

    def __enter__(self) -> FakeModel:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class _ThreadServer(uvicorn.Server):
    """uvicorn in a background thread: signal handling stays with the main thread (pytest's)."""

    def install_signal_handlers(self) -> None:  # uvicorn < 0.29
        return None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # uvicorn >= 0.29
        yield
