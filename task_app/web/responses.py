"""JSON responses encoded by the app's codec (core/json_codec.py)."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from ..core.json_codec import dumps_bytes


class JSONBytes(JSONResponse):
    """A JSONResponse (so FastAPI documents routes' JSON bodies) that also passes pre-encoded bytes through."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        if isinstance(content, bytes):
            return content
        return dumps_bytes(content)
