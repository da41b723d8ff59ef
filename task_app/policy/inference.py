"""The chat-completions client a `crafter-react` policy talks through.

    InferenceTarget ── where to send (full URL), which provider, which key (resolve_target)
    chat_params()   ── the vendor's parameter rules (max_tokens vs max_completion_tokens, sampling)
    InferenceClient ── one POST with retries, bounded by attempts *and* the rollout's deadline

The target / params / auth helpers are pure functions so the vendor proxy routes can reuse them.

Retry policy (the old system retried for over an hour and never retried connection errors):
connection errors, timeouts, 429 and 5xx are retried (`core.backoff`: exponential backoff with full
jitter, a Retry-After honoured), at most `max_attempts` times, and never past the deadline: a wait
that would end after it is not started, and each attempt is bounded in total by
min(connect + read timeout, remaining time + DEADLINE_GRACE_S). Any other 4xx fails at once.

A 200 whose body is not JSON, or is longer than `max_response_bytes` (cut off unread), is *not*
retried and *not* an error: `ChatResult.body` is None and `ChatResult.invalid_reason` says why; the
policy turns it into an unusable answer for that decision, so the engine's "three unusable answers in
a row" rule bounds a model server that keeps answering garbage.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
from pydantic import SecretStr

from ..core.backoff import ATTEMPTS, Backoff, retry_after_seconds
from ..core.errors import NotConfigured
from ..core.json_codec import dumps_bytes, loads
from ..core.outbound import AnswerTooLarge, Outbound, SendFailure, Target, parse_url, post
from ..core.settings import Settings
from .base import PolicyError
from .providers import PROVIDER_CUSTOM, PROVIDER_GROQ, PROVIDER_OPENAI, is_reasoning_model

logger = logging.getLogger(__name__)

CHAT_PATH = "/chat/completions"
JSON_TYPE = "application/json"
DEFAULT_PATH = "/v1" + CHAT_PATH
DEFAULT_MAX_TOKENS = 512  # the contract's default (docs/contract.md)
# Reasoning models spend completion tokens on hidden reasoning; 512 would often end in an empty answer.
DEFAULT_REASONING_MAX_TOKENS = 4096
# Extra policy.config keys forwarded verbatim to any server, and the sampling keys only self-hosted
# (vLLM, SGLang) servers know; anything else a trainer's server needs goes in policy.config.extra_body.
_PASSTHROUGH = ("seed", "stop", "frequency_penalty", "presence_penalty", "reasoning_effort", "logprobs", "top_logprobs")
_PASSTHROUGH_SELF_HOSTED = (
    "top_k",
    "min_p",
    "repetition_penalty",
    "chat_template_kwargs",
    "min_tokens",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
    "length_penalty",
    "logit_bias",
    "bad_words",
    "allowed_token_ids",
)
_ERROR_TOKEN = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
RESPONSE_TOO_LARGE = "response_too_large"
_HTTP_TOO_MANY_REQUESTS = 429
_HTTP_SERVER_ERROR = 500
# An attempt's own time limit ends this long after the deadline: inside a rollout the engine's cancel
# scope (same deadline) fires first, so the rollout reports stop_reason "deadline" rather than a policy
# error; used standalone, a call still ends within this margin of its deadline.
DEADLINE_GRACE_S = 0.2


# --- where to send ---------------------------------------------------------------------------------


def chat_completions_url(url: str) -> str:
    """The full chat-completions URL for a base or full URL; the query (e.g. `?cid=trace_x`) is kept.

    `https://h` → `https://h/v1/chat/completions`; `.../v1` → `.../v1/chat/completions`;
    `.../chat/completions` unchanged; any other path (e.g. this app's `/proxy/groq`) gets
    `/v1/chat/completions`. Never `/v1/v1` (an old system's defect). A path that a caller glued after
    the query (`https://h?cid=x/v1/chat/completions`) is moved back into the path, as the old system did.
    """
    parts = urlsplit(url.strip())
    path, query = parts.path, parts.query
    if "/" in query:
        head, _, tail = query.partition("/")
        end = re.search(r"[&?]", tail)
        moved, rest = (tail[: end.start()], tail[end.end() :]) if end else (tail, "")
        path = path.rstrip("/") + "/" + moved
        query = "&".join(part for part in (head, rest) if part)
    path = path.rstrip("/")
    if path.endswith(CHAT_PATH):
        pass
    elif path.endswith("/chat"):
        path += "/completions"
    elif re.search(r"/v\d+$", path):
        path += CHAT_PATH
    else:
        path += DEFAULT_PATH
    return urlunsplit((parts.scheme, parts.netloc, path, query, ""))


def _host(url: str) -> str:
    return (urlsplit(url).hostname or "").lower()


@dataclass(frozen=True, slots=True)
class InferenceTarget:
    """A resolved destination. `api_key` is a SecretStr, so reprs and logs never show it."""

    url: str
    provider: str
    api_key: SecretStr | None = field(default=None, repr=False)
    # Parsed once rather than on every request; None when it does not parse (the str is sent and refused).
    http_url: Target | None = field(default=None, init=False, repr=False, compare=False)
    host: str = field(default="", init=False, repr=False, compare=False)  # lower-case, for logs

    def __post_init__(self) -> None:
        object.__setattr__(self, "http_url", parse_url(self.url))
        object.__setattr__(self, "host", _host(self.url))

    def headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.api_key is not None and self.api_key.get_secret_value():
            headers["Authorization"] = f"Bearer {self.api_key.get_secret_value()}"
        return headers


def provider_of(url: str, settings: Settings) -> str:
    host = _host(url)
    if host and host == _host(settings.openai_base_url):
        return PROVIDER_OPENAI
    if host and host == _host(settings.groq_base_url):
        return PROVIDER_GROQ
    return PROVIDER_CUSTOM


def vendor_key(provider: str, settings: Settings) -> SecretStr | None:
    """The app's own vendor key; the app's ENVIRONMENT_API_KEY is never a candidate."""
    if provider == PROVIDER_OPENAI:
        return settings.openai_api_key
    if provider == PROVIDER_GROQ:
        return settings.groq_api_key
    return None


def resolve_target(
    *, inference_url: str | None, provider: str | None, api_key: SecretStr | None, settings: Settings
) -> InferenceTarget:
    """Decide URL, provider label and Authorization key for one policy.

    - `inference_url` wins; otherwise `provider` picks settings.openai_base_url / groq_base_url.
    - Key: the caller's `api_key` if given; else the app's vendor key, but only when the URL's host
      *is* that vendor's host (a trainer's own server never receives our OpenAI/Groq key).
    - A provider route without any key is refused up front (503), never silently rerouted (the old system did).
    """
    if inference_url:
        url = chat_completions_url(inference_url)
        host_provider = provider_of(url, settings)
        label = host_provider if host_provider != PROVIDER_CUSTOM else (provider or PROVIDER_CUSTOM)
        key = api_key if api_key is not None else vendor_key(host_provider, settings)
        return InferenceTarget(url, label, key)
    if provider not in (PROVIDER_OPENAI, PROVIDER_GROQ):
        raise NotConfigured("no inference_url and no known provider", code="missing_inference_url")
    key = api_key if api_key is not None else vendor_key(provider, settings)
    if key is None or not key.get_secret_value():
        name = "OPENAI_API_KEY" if provider == PROVIDER_OPENAI else "GROQ_API_KEY"
        raise NotConfigured(f"{name} is not configured on this task app", code=f"missing_{provider}_api_key")
    return InferenceTarget(vendor_url(provider, settings), provider, key)


def vendor_url(provider: str, settings: Settings) -> str:
    """The chat-completions URL of a vendor (`openai` or `groq`) this app routes to."""
    return chat_completions_url(settings.openai_base_url if provider == PROVIDER_OPENAI else settings.groq_base_url)


# --- what to send ----------------------------------------------------------------------------------


def chat_params(
    model: str,
    *,
    provider: str,
    temperature: float | None = None,
    top_p: float | None = None,
    max_tokens: int | None = None,
    max_completion_tokens: int | None = None,
    extras: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Sampling parameters for `model` as its vendor accepts them (everything except messages/tools)."""
    params: dict[str, Any] = {"model": model}
    if is_reasoning_model(model):
        params["max_completion_tokens"] = max_completion_tokens or max_tokens or DEFAULT_REASONING_MAX_TOKENS
    else:
        params["max_tokens"] = max_tokens or max_completion_tokens or DEFAULT_MAX_TOKENS
        if temperature is not None:
            params["temperature"] = temperature
        if top_p is not None:
            params["top_p"] = top_p
    allowed = _PASSTHROUGH if provider in (PROVIDER_OPENAI, PROVIDER_GROQ) else _PASSTHROUGH + _PASSTHROUGH_SELF_HOSTED
    for key in allowed:
        if extras and extras.get(key) is not None:
            params[key] = extras[key]
    return params


# --- how to send -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InferenceLimits:
    """Per-call limits, from Settings (`InferenceLimits.from_settings`)."""

    connect_timeout_s: float = 10.0
    read_timeout_s: float = 120.0
    max_attempts: int = 4
    backoff_s: float = 0.5
    backoff_max_s: float = 8.0
    max_response_bytes: int = 8 * 1024 * 1024
    abort_retries: int = 8

    @classmethod
    def from_settings(cls, settings: Settings) -> InferenceLimits:
        return cls(
            connect_timeout_s=settings.inference_connect_timeout_s,
            read_timeout_s=settings.inference_read_timeout_s,
            max_attempts=settings.inference_max_attempts,
            backoff_s=settings.inference_backoff_s,
            backoff_max_s=settings.inference_backoff_max_s,
            max_response_bytes=settings.inference_max_response_bytes,
            abort_retries=settings.inference_abort_retries,
        )


@dataclass(slots=True)
class ChatResult:
    """One successful (2xx) exchange. `body` is None when the answer was not a JSON object."""

    body: dict[str, Any] | None
    status: int
    attempts: int
    started_at: datetime
    finished_at: datetime
    latency_ms: float
    invalid_reason: str | None = None
    policy_version: str | None = None  # the answer's X-Policy-Version header (policy/versions.py)


class _Retryable(Exception):
    """An attempt failed in a way another attempt may fix; carries the code to raise if none does."""

    def __init__(self, message: str, code: str, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.code, self.status, self.retry_after = code, status, retry_after


def _error_hint(raw: bytes) -> str:
    """A vendor's error code/type, if it is a short token. Never the message: vendors echo key prefixes."""
    try:
        data = loads(raw)
    except (ValueError, RecursionError):
        return ""
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        return ""
    tokens = [str(error[k]) for k in ("code", "type") if isinstance(error.get(k), str) and _ERROR_TOKEN.match(error[k])]
    return f" ({', '.join(tokens)})" if tokens else ""


class InferenceClient:
    """Sends chat-completions requests through the app's one outbound client (`task_app.core.outbound`).

    Stateless apart from its limits, so one instance serves every rollout; tests point it at a
    loopback server.
    """

    def __init__(self, http: Outbound, limits: InferenceLimits, *, rng: random.Random | None = None) -> None:
        self.http = http
        self.limits = limits
        self.backoff = Backoff(
            limits.backoff_s, limits.backoff_max_s, max_attempts=limits.max_attempts, rng=rng or random.Random()
        )

    async def chat(
        self, target: InferenceTarget, body: dict[str, Any], *, deadline: float | None, run_id: str | None = None
    ) -> ChatResult:
        """POST `body` to `target`; retry what is worth retrying; raise PolicyError when nothing worked.

        `deadline` is absolute, in `anyio.current_time()` units; None means only the attempt limit.
        """
        started_at, start = datetime.now(UTC), anyio.current_time()
        content = dumps_bytes(body)  # encoded once for every attempt (NaN is written as null)
        headers = {**target.headers(), "Content-Type": JSON_TYPE}
        url = target.http_url or target.url
        retry = self.backoff.start(deadline)
        while True:
            remaining = retry.remaining()
            if remaining is not None and remaining <= 0:
                raise PolicyError(
                    f"rollout deadline reached before inference attempt {retry.attempt}", code="inference_timeout"
                )
            try:
                status, payload, reason, version = await self._attempt(url, content, headers, remaining)
            except _Retryable as failure:
                attempt = retry.attempt
                wait = retry.next_wait(failure.retry_after)
                if wait is None:
                    why = "attempts exhausted" if retry.stopped == ATTEMPTS else "no time left to retry"
                    raise PolicyError(
                        f"inference failed after {attempt} attempt(s), {why}: {failure}",
                        code=failure.code,
                        status=failure.status,
                    ) from failure
                logger.warning(
                    "inference attempt %d/%d to %s failed (%s); retrying in %.2fs",
                    attempt,
                    self.limits.max_attempts,
                    target.host,
                    failure,
                    wait,
                    extra={"run_id": run_id},
                )
                await anyio.sleep(wait)
                continue
            finished = anyio.current_time()
            logger.debug(
                "inference %s model=%s status=%d attempts=%d latency_ms=%.0f",
                target.host,
                body.get("model"),
                status,
                retry.attempt,
                (finished - start) * 1000,
                extra={"run_id": run_id},
            )
            return ChatResult(
                payload,
                status,
                retry.attempt,
                started_at,
                datetime.now(UTC),
                (finished - start) * 1000,
                reason,
                version,
            )

    async def _attempt(
        self, url: Target | str, content: bytes, headers: dict[str, str], remaining: float | None
    ) -> tuple[int, dict[str, Any] | None, str | None, str | None]:
        """One request: (status, parsed body or None, why the body is unusable, the X-Policy-Version header).
        Raises _Retryable/PolicyError."""
        limits = self.limits
        cap = remaining if remaining is not None else float("inf")
        # One attempt gets at most connect + read timeout in total, so a server that drips bytes (never
        # tripping the per-read timeout) is cut and retried like one that hangs.
        budget = limits.connect_timeout_s + limits.read_timeout_s
        try:
            answer = await post(
                self.http,
                url,
                content,
                headers,
                connect_timeout_s=min(limits.connect_timeout_s, cap),
                read_timeout_s=min(limits.read_timeout_s, cap),
                total_timeout_s=budget if remaining is None else min(budget, remaining + DEADLINE_GRACE_S),
                max_bytes=limits.max_response_bytes,
            )
        except AnswerTooLarge as exc:
            return exc.status, None, RESPONSE_TOO_LARGE, None
        except SendFailure as exc:
            if exc.kind == SendFailure.REQUEST:
                raise PolicyError(f"cannot send the inference request: {exc}", code="inference_request_error") from exc
            code = "inference_timeout" if exc.kind == SendFailure.TIMEOUT else "inference_unavailable"
            raise _Retryable(str(exc), code) from exc
        if not answer.ok:
            raise self._status_error(answer.status, answer.body, answer.retry_after)
        try:
            parsed = loads(answer.body)
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            return answer.status, None, "invalid_json", answer.policy_version
        if not isinstance(parsed, dict):
            return answer.status, None, "response_not_an_object", answer.policy_version
        return answer.status, parsed, None, answer.policy_version

    @staticmethod
    def _status_error(status: int, raw: bytes, retry_after: str | None) -> Exception:
        hint = _error_hint(raw)
        if status == _HTTP_TOO_MANY_REQUESTS:
            return _Retryable(f"HTTP 429{hint}", "inference_rate_limited", status, retry_after_seconds(retry_after))
        if status >= _HTTP_SERVER_ERROR:
            return _Retryable(f"HTTP {status}{hint}", "inference_unavailable", status, retry_after_seconds(retry_after))
        return PolicyError(f"the model server answered HTTP {status}{hint}", code="inference_http_error", status=status)
