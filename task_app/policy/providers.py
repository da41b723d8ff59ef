"""Who serves a model: the provider labels a policy and the vendor proxies share, and what a model's
name says about the parameters it takes."""

from __future__ import annotations

import re

PROVIDER_OPENAI, PROVIDER_GROQ, PROVIDER_CUSTOM = "openai", "groq", "custom"
_REASONING_MODEL = re.compile(r"^(gpt-5|o\d)")


def is_reasoning_model(model: str) -> bool:
    """gpt-5* and o-series models: `max_completion_tokens`, no temperature / top_p, no logprobs."""
    return bool(_REASONING_MODEL.match(model.rsplit("/", 1)[-1].strip().lower()))
