"""Short-lived session tokens for OpenEnv clients that cannot send headers (openenv < 0.9).

    POST /openenv/tokens (API key) ─► token = token_urlsafe(32) ─► store: openenv/tokens/<sha256(token)>
    /openenv/t/<token>/... ─► sha256(token) ─► the record (expiry, the HTTP env's spec) or 401

The store holds only each token's SHA-256 digest, so a read of the store yields no usable token. A
token is looked up by its digest (a lookup's timing says nothing about the token's characters) and the
digest is then compared with `hmac.compare_digest`. Tokens expire (the record's TTL) and can be revoked
(the record deleted); each process caches a verdict for at most `CACHE_S`, so a revocation reaches
every process within that time. Tokens are never logged: `web/redaction.py` takes them out of the
server's access log lines.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..core.json_codec import dumps_bytes, loads
from ..store import StateStore

TOKEN = re.compile(r"^[A-Za-z0-9_-]{43}$")  # secrets.token_urlsafe(32)
CACHE_S = 1.0
CACHE_ENTRIES = 4096


@dataclass(frozen=True, slots=True)
class TokenInfo:
    digest: str
    expires_at: float
    seed: int | None
    config: dict[str, Any] = field(default_factory=dict)


def digest_of(token: str) -> str:
    return hashlib.sha256(token.encode("ascii")).hexdigest()


def _record_key(digest: str) -> str:
    return f"openenv/tokens/{digest}"


def _session_key(digest: str) -> str:
    return f"openenv/tokens/{digest}/session"


class TokenRegistry:
    def __init__(self, store: StateStore, max_ttl_s: float, monotonic: Any = time.monotonic) -> None:
        self.store = store
        self.max_ttl_s = max_ttl_s
        self._monotonic = monotonic
        self._cache: OrderedDict[str, tuple[TokenInfo | None, float]] = OrderedDict()

    async def mint(self, ttl_s: float | None, seed: int | None, config: dict[str, Any]) -> tuple[str, float]:
        """A new token and its expiry (wall clock): `ttl_s`, capped at the configured maximum."""
        lifetime = min(ttl_s or self.max_ttl_s, self.max_ttl_s)
        token = secrets.token_urlsafe(32)
        digest = digest_of(token)
        expires_at = self.store.clock() + lifetime
        record = {"digest": digest, "expires_at": expires_at, "seed": seed, "config": config}
        await self.store.put(_record_key(digest), dumps_bytes(record), ttl_s=lifetime)
        return token, expires_at

    async def verify(self, token: str) -> TokenInfo | None:
        if not TOKEN.match(token):
            return None
        digest = digest_of(token)
        now = self._monotonic()
        cached = self._cache.get(digest)
        if cached is not None and now - cached[1] < CACHE_S:
            info = cached[0]
        else:
            raw = await self.store.get(_record_key(digest))
            info = None
            if raw is not None:
                value = loads(raw)
                if hmac.compare_digest(str(value.get("digest", "")), digest):
                    info = TokenInfo(digest, float(value["expires_at"]), value.get("seed"), dict(value["config"]))
            self._cache[digest] = (info, now)
            self._cache.move_to_end(digest)
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
        if info is not None and info.expires_at <= self.store.clock():
            return None
        return info

    async def revoke(self, token: str) -> bool:
        info = await self.verify(token)
        if info is None:
            return False
        self._cache.pop(info.digest, None)
        await self.store.delete([_record_key(info.digest), _session_key(info.digest)])
        return True

    async def bound_session(self, info: TokenInfo) -> str | None:
        """The tool session this token's HTTP routes drive by default, once the first reset made it."""
        raw = await self.store.get(_session_key(info.digest))
        return str(loads(raw)) if raw is not None else None

    async def bind_session(self, info: TokenInfo, session_id: str, *, replace: bool = False) -> str:
        """Bind `session_id` (first binder wins across processes; `replace` after the bound one ended)."""
        ttl = max(1.0, info.expires_at - self.store.clock())
        if replace:
            await self.store.put(_session_key(info.digest), dumps_bytes(session_id), ttl_s=ttl)
            return session_id
        if await self.store.put_if_absent(_session_key(info.digest), dumps_bytes(session_id), ttl_s=ttl):
            return session_id
        return await self.bound_session(info) or session_id

    @staticmethod
    def scope(info: TokenInfo) -> str:
        """The tool-session scope of a token: its sessions are found with it and no other token."""
        return f"token:{info.digest[:32]}"
