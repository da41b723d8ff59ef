"""JSON responses encoded with orjson (several times faster than the stdlib for rollout bodies)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import JSONResponse


class JSONBytes(JSONResponse):
    """A JSONResponse (so FastAPI documents routes' JSON bodies) that also passes pre-encoded bytes through."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        if isinstance(content, bytes):
            return content
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)
