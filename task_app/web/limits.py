"""ASGI middleware that refuses request bodies over the configured size with 413."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..core.errors import error_body
from ..core.json_codec import dumps_bytes

# Before refusing, read and drop what the client is still sending, up to this much: answering and
# closing while request bytes sit unread makes the kernel reset the connection, and the client then
# sees "connection reset" instead of the 413 (nginx's "lingering close" does the same).
DRAIN_LIMIT_BYTES = 16 * 1024 * 1024


class BodySizeLimit:
    """Checks `Content-Length` up front and counts streamed (chunked) bodies as they arrive."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _message(self) -> str:
        return f"request body is larger than the {self.max_bytes} bytes this server accepts (TASKAPP_MAX_BODY_BYTES)"

    @staticmethod
    async def _drain(receive: Receive, received: int) -> None:
        while received <= DRAIN_LIMIT_BYTES:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body"):
                return
            received += len(message.get("body", b""))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            if int(declared) <= DRAIN_LIMIT_BYTES:
                await self._drain(receive, 0)
            message = self._message()
            body = dumps_bytes(error_body("payload_too_large", message))
            await send(
                {
                    "type": "http.response.start",
                    "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"connection", b"close")],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    if message.get("more_body"):
                        await self._drain(receive, received)
                    raise HTTPException(413, self._message())
            return message

        await self.app(scope, counted, send)
