"""The policy version of a decision: which weights answered it (docs/training-data.md, "Policy versions").

    1. the answer's `X-Policy-Version` header     (the trainer's model server sets it per answer)
    2. the served model name's `-v<N>` suffix     (the LoRA convention `{name}-v{N}`; the answer's `model`)
    3. `policy.config.policy_version`              (what the trainer said when it sent the rollout)

The first that holds a non-negative integer wins; a decision with none has no version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

HEADER, MODEL_NAME, CONFIG = "header", "model_name", "config"
_SUFFIX = re.compile(r"-v(\d{1,18})$")
_INTEGER = re.compile(r"^\s*(\d{1,18})\s*$")


@dataclass(frozen=True, slots=True)
class PolicyVersion:
    version: int
    source: str  # HEADER | MODEL_NAME | CONFIG


def policy_version(header: str | None, served_model: str | None, configured: int | None) -> PolicyVersion | None:
    """The decision's version by the precedence above, or None."""
    match = _INTEGER.match(header) if header is not None else None
    if match is not None:
        return PolicyVersion(int(match.group(1)), HEADER)
    match = _SUFFIX.search(served_model) if served_model else None
    if match is not None:
        return PolicyVersion(int(match.group(1)), MODEL_NAME)
    return PolicyVersion(configured, CONFIG) if configured is not None else None
