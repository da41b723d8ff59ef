"""Exact tokens: what to ask a model server for, and what its answer says, read and checked, never re-made.

An RL trainer learns from what the model sampled, so a decision's tokens must be the server's own:
nothing here tokenizes, detokenizes or fills a gap. What each server is asked for (`request_fields`):

    self-hosted (vLLM, SGLang, ...)  logprobs: true, top_logprobs: 0,
                                     return_token_ids: true, return_tokens_as_token_ids: true
    OpenAI                           logprobs: true, top_logprobs: 0  (no ids exist; reasoning models: nothing)
    Groq                             nothing (Groq does not return logprobs)

and where the answer carries them (`read_tokens`):

    prompt ids       body.prompt_token_ids (vLLM) | choices[0].prompt_token_ids (SGLang)
    completion ids   choices[0].token_ids (vLLM, SGLang) | choices[0].logprobs.content[].token spelled
                     "token_id:<n>" (vLLM's return_tokens_as_token_ids)
    logprobs         choices[0].logprobs.content[].logprob
    also             choices[0].finish_reason, body.model (the model name the server reported)

A decision whose server sent no ids (OpenAI never does) is `tokens_missing: true` with the reason; one
whose token data is inconsistent (lengths that disagree, ids that are not non-negative integers,
logprobs that are not finite numbers, more completion tokens than the request allowed) is rejected
whole with the precise reason: its arrays are null, the decision itself still plays.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .providers import PROVIDER_CUSTOM, PROVIDER_GROQ, PROVIDER_OPENAI, is_reasoning_model

MAX_TOKEN_IDS = 1 << 20  # a list longer than this (~1M tokens) is not an answer we keep
_EXCERPT_CHARS = 40  # how much of a bad value a reason quotes
TOKEN_ID_PREFIX = "token_id:"
_TOKEN_ID = re.compile(r"^token_id:(\d+)$")
SELF_HOSTED_FIELDS: dict[str, Any] = {
    "logprobs": True,
    "top_logprobs": 0,
    "return_token_ids": True,
    "return_tokens_as_token_ids": True,
}
OPENAI_FIELDS: dict[str, Any] = {"logprobs": True, "top_logprobs": 0}


# What each provider's answers carry (`/info`'s `tokens.providers`): ids make episode sequences possible.
PROVIDER_TOKENS: dict[str, dict[str, Any]] = {
    PROVIDER_CUSTOM: {"prompt_ids": True, "completion_ids": True, "logprobs": True},
    PROVIDER_OPENAI: {"prompt_ids": False, "completion_ids": False, "logprobs": "not for reasoning models"},
    PROVIDER_GROQ: {"prompt_ids": False, "completion_ids": False, "logprobs": False},
}


def request_fields(provider: str, model: str) -> dict[str, Any]:
    """The fields that ask `provider` for exact tokens (the caller's own values take precedence)."""
    if provider == PROVIDER_GROQ:
        return {}
    if provider == PROVIDER_OPENAI:
        return {} if is_reasoning_model(model) else dict(OPENAI_FIELDS)
    return dict(SELF_HOSTED_FIELDS)


def unavailable_reason(provider: str, model: str) -> str | None:
    """Why `provider` cannot return tokens at all, or None when it may."""
    if provider == PROVIDER_GROQ:
        return "Groq returns no logprobs or token ids"
    if provider == PROVIDER_OPENAI and is_reasoning_model(model):
        return f"OpenAI's reasoning model {model} returns no logprobs"
    return None


@dataclass(frozen=True, slots=True)
class TokenData:
    """One decision's tokens as the server sent them (`info.tokens`, `decision_samples[].tokens`:
    docs/training-data.md)."""

    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None
    completion_tokens: list[str] | None = None  # text pieces (OpenAI, SGLang); None when spelled token_id:<n>
    finish_reason: str | None = None
    model: str | None = None
    tokens_missing: bool = True
    tokens_missing_reason: str | None = None

    @property
    def logprob(self) -> float | None:
        """The completion's log-probability: the sum of its token logprobs (the step's `logprob`)."""
        return math.fsum(self.completion_logprobs) if self.completion_logprobs is not None else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "prompt_token_ids": self.prompt_token_ids,
            "completion_token_ids": self.completion_token_ids,
            "completion_logprobs": self.completion_logprobs,
            "completion_tokens": self.completion_tokens,
            "finish_reason": self.finish_reason,
            "model": self.model,
            "tokens_missing": self.tokens_missing,
            "tokens_missing_reason": self.tokens_missing_reason,
        }


def missing(reason: str, *, finish_reason: str | None = None, model: str | None = None) -> TokenData:
    return TokenData(finish_reason=finish_reason, model=model, tokens_missing=True, tokens_missing_reason=reason)


class _Invalid(ValueError):
    """Token data that contradicts itself; the message says where."""


def _ids(value: Any, where: str, limit: int, what: str) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise _Invalid(f"{where} is not a list")
    if len(value) > limit:
        raise _Invalid(f"{where} has {len(value)} entries, more than the {limit} {what}")
    for index, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise _Invalid(f"{where}[{index}] is {_short(item)}, not a non-negative integer")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _EXCERPT_CHARS else text[: _EXCERPT_CHARS - 3] + "..."


def _logprob_entries(choice: Mapping[str, Any], limit: int, what: str) -> tuple[list[str], list[float]] | None:
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, Mapping) else None
    if logprobs is None or content is None:
        return None
    where = "choices[0].logprobs.content"
    if not isinstance(content, list):
        raise _Invalid(f"{where} is not a list")
    if len(content) > limit:
        raise _Invalid(f"{where} has {len(content)} entries, more than the {limit} {what}")
    tokens, values = [], []
    for index, entry in enumerate(content):
        if not isinstance(entry, Mapping):
            raise _Invalid(f"{where}[{index}] is not an object")
        token, value = entry.get("token"), entry.get("logprob")
        if not isinstance(token, str):
            raise _Invalid(f"{where}[{index}].token is not a string")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise _Invalid(f"{where}[{index}].logprob is {_short(value)}, not a finite number")
        tokens.append(token)
        values.append(float(value))
    return tokens, values


def _spelled_ids(tokens: list[str]) -> list[int] | None:
    """The ids of tokens spelled `token_id:<n>` (all of them), else None."""
    ids = []
    for token in tokens:
        match = _TOKEN_ID.match(token)
        if match is None:
            return None
        ids.append(int(match.group(1)))
    return ids


def _prompt_ids(body: Mapping[str, Any], choice: Mapping[str, Any]) -> list[int] | None:
    if body.get("prompt_token_ids") is not None:
        return _ids(body["prompt_token_ids"], "prompt_token_ids", MAX_TOKEN_IDS, "kept")
    return _ids(choice.get("prompt_token_ids"), "choices[0].prompt_token_ids", MAX_TOKEN_IDS, "kept")


def read_tokens(body: Mapping[str, Any] | None, *, max_completion_tokens: int | None = None) -> TokenData:
    """The tokens of a chat-completions answer, checked; `max_completion_tokens` is what the request allowed."""
    choices = body.get("choices") if body is not None else None
    choice = choices[0] if isinstance(choices, list) and choices else None
    if body is None or not isinstance(choice, Mapping):
        return missing("the answer has no choices to read tokens from")
    model = body.get("model") if isinstance(body.get("model"), str) else None
    finish = choice.get("finish_reason") if isinstance(choice.get("finish_reason"), str) else None
    limit, what = (
        (max_completion_tokens, "tokens the request allowed") if max_completion_tokens else (MAX_TOKEN_IDS, "kept")
    )
    try:
        prompt = _prompt_ids(body, choice)
        completion = _ids(choice.get("token_ids"), "choices[0].token_ids", limit, what)
        entries = _logprob_entries(choice, limit, what)
        tokens, logprobs = entries if entries is not None else (None, None)
        spelled = _spelled_ids(tokens) if tokens else None
        _check_agreement(completion, tokens, spelled)
    except _Invalid as exc:
        return missing(f"invalid token data: {exc}", finish_reason=finish, model=model)
    if completion is None:
        completion = spelled
    gaps = []
    if logprobs is None:
        gaps.append("no logprobs (choices[0].logprobs.content)")
    if completion is None:
        gaps.append("no completion token ids (choices[0].token_ids)")
    if prompt is None:
        gaps.append("no prompt token ids (prompt_token_ids)")
    return TokenData(
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        completion_logprobs=logprobs,
        completion_tokens=tokens if spelled is None else None,
        finish_reason=finish,
        model=model,
        tokens_missing=bool(gaps),
        tokens_missing_reason=f"the server sent {', '.join(gaps)}" if gaps else None,
    )


def _check_agreement(completion: list[int] | None, tokens: list[str] | None, spelled: list[int] | None) -> None:
    if completion is None or tokens is None:
        return
    if len(completion) != len(tokens):
        raise _Invalid(
            f"choices[0].token_ids has {len(completion)} entries but choices[0].logprobs.content has {len(tokens)}"
        )
    if spelled is not None and spelled != completion:
        index = next(i for i, (a, b) in enumerate(zip(spelled, completion, strict=True)) if a != b)
        raise _Invalid(
            f"choices[0].logprobs.content[{index}].token is {tokens[index]!r} "
            f"but choices[0].token_ids[{index}] is {completion[index]}"
        )
