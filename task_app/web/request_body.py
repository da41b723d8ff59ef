"""A request's body read ahead of the app that answers it, and handed on as if unread."""

from __future__ import annotations

from starlette.types import Message, Receive


async def read_body(receive: Receive) -> tuple[bytes | None, Receive]:
    """The request's body (None when the client went away before it was whole), and a `receive` that
    gives the app every message read here, then whatever comes next."""
    received: list[Message] = []
    while True:
        message = await receive()
        received.append(message)
        if message["type"] != "http.request":
            return None, _replaying(received, receive)
        if not message.get("more_body", False):
            body = b"".join(message.get("body", b"") for message in received)
            return body, _replaying(received, receive)


def _replaying(received: list[Message], receive: Receive) -> Receive:
    pending = list(received)

    async def replay() -> Message:
        return pending.pop(0) if pending else await receive()

    return replay
