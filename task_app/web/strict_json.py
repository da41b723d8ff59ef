"""Request bodies are parsed strictly (`json_codec.loads(strict=True)`): only I-JSON (RFC 7493), strict UTF-8.

The stdlib parser FastAPI uses turns `"\\ud800"` (a lone surrogate escape) into a Python string that
cannot be encoded again, so it failed later, deep inside a rollout or the proxy (a 500 instead of a
400); it also accepts `NaN` / `Infinity`, which are not JSON. The strict parse refuses all of these,
and nesting deeper than 1024 levels, with a `JSONDecodeError`, which FastAPI reports as `json_invalid`
and `server.py` answers with 400 `invalid_json`.

The routers that take a body use it: `APIRouter(route_class=StrictJSONRoute)`.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from ..core.json_codec import loads

__all__ = ["StrictJSONRequest", "StrictJSONRoute"]


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads(await self.body(), strict=True)
        return self._json


class StrictJSONRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict_handler
