"""API-key check for protected routes (docs/contract.md, "Authentication"): one layer, constant-time comparisons."""

from __future__ import annotations

import hmac

from starlette.requests import HTTPConnection

from ..core.errors import NotConfigured, Unauthorized
from ..core.settings import Settings


def presented_keys(connection: HTTPConnection) -> list[str]:
    """Every key a caller presents: `X-API-Key`, `X-API-Keys` (comma-separated), `Authorization: Bearer`."""
    candidates: list[str] = []
    for header in ("x-api-key", "x-api-keys"):
        for value in connection.headers.getlist(header):
            candidates.extend(part.strip() for part in value.split(","))
    authorization = connection.headers.get("authorization", "")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "bearer":
        candidates.append(token.strip())
    return [candidate for candidate in candidates if candidate]


def is_authorised(presented: list[str], accepted: list[str]) -> bool:
    """True when any presented key equals any accepted key; every pair is compared in constant time."""
    matched = False
    for candidate in presented:
        for key in accepted:
            matched |= hmac.compare_digest(candidate.encode(), key.encode())
    return matched


def check_api_key(connection: HTTPConnection, settings: Settings) -> None:
    accepted = settings.api_keys
    if not accepted:
        raise NotConfigured("ENVIRONMENT_API_KEY is not configured on this server", code="missing_environment_api_key")
    if not is_authorised(presented_keys(connection), accepted):
        raise Unauthorized("API key missing or invalid")
