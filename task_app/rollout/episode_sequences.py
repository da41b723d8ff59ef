"""Episode sequences (`record.tokens: "episode"`): one trainable token sequence per episode, made only of
the ids the model server returned, and checked token for token (docs/episode-sequences.md).

    turn 0   prompt₀ ─────────────────┬ completion₀
    turn 1   prompt₁ = prompt₀ + completion₀ + new₁ ┬ completion₁
    ...
    input_ids = prompt₀ + completion₀ + new₁ + completion₁ + ...
    loss_mask   0…0       1…1           0…0    1…1             (1 on sampled tokens only)
    logprobs    null…     the server's  null…  the server's

A turn is a model call that answered. Each turn's `prompt_token_ids` must start with the previous
turn's prompt followed by its completion, exactly; the first turn where one does not (a chat template
that re-renders earlier turns, reasoning not sent back, the history budget dropping a turn) or whose
tokens are missing breaks the chain: the episode is then `prefix_consistent: false` with where it broke
(`divergence`) and the per-turn samples instead of a sequence. Nothing is re-tokenized or repaired.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .result import RolloutResult

PROMPT_DIFFERS, PROMPT_SHORTER, TOKENS_MISSING = "prompt_differs", "prompt_shorter", "tokens_missing"


@dataclass(frozen=True, slots=True)
class Turn:
    """One answered model call of an episode: its decision index and its token data (the keys of
    `TokenData.as_dict()`: `prompt_token_ids`, `completion_token_ids`, `completion_logprobs`, ...)."""

    decision_index: int
    tokens: Mapping[str, Any] | None


class _Break(Exception):
    def __init__(self, turn: int, token_index: int | None, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.turn = turn
        self.divergence = {"turn": turn, "token_index": token_index, "reason": reason, "detail": detail}


def _first_difference(prompt: Sequence[int], expected: Sequence[int]) -> int | None:
    """The first index where `prompt` does not extend `expected` (None when it does)."""
    if prompt[: len(expected)] == expected:
        return None if len(prompt) >= len(expected) else len(prompt)
    differing = (index for index, (a, b) in enumerate(zip(prompt, expected, strict=False)) if a != b)
    return next(differing, len(prompt))  # no differing token: the prompt is a shorter prefix


def _exact(tokens: Mapping[str, Any] | None, turn: int) -> tuple[list[int], list[int], list[float]]:
    prompt = tokens.get("prompt_token_ids") if tokens is not None else None
    completion = tokens.get("completion_token_ids") if tokens is not None else None
    logprobs = tokens.get("completion_logprobs") if tokens is not None else None
    if tokens is None or tokens.get("tokens_missing") or prompt is None or completion is None or logprobs is None:
        reason = (tokens or {}).get("tokens_missing_reason") or "the decision has no exact tokens"
        raise _Break(turn, None, TOKENS_MISSING, f"turn {turn}: {reason}")
    return prompt, completion, logprobs


def _sequence(turns: Sequence[Turn]) -> dict[str, Any]:
    input_ids: list[int] = []
    loss_mask: list[int] = []
    logprobs: list[float | None] = []
    bounds = []
    for number, turn in enumerate(turns):
        prompt, completion, completion_logprobs = _exact(turn.tokens, number)
        index = _first_difference(prompt, input_ids)
        if index is not None:
            reason = PROMPT_SHORTER if index == len(prompt) else PROMPT_DIFFERS
            detail = (
                f"turn {number}'s prompt_token_ids[{index}] is not the previous prompt and completion's token {index}"
                if reason == PROMPT_DIFFERS
                else f"turn {number}'s prompt ({len(prompt)} tokens) is shorter than the previous prompt and completion"
            )
            raise _Break(number, index, reason, detail)
        start = len(input_ids)
        new = len(prompt) - start
        input_ids.extend(prompt[start:])
        loss_mask.extend([0] * new)
        logprobs.extend([None] * new)
        completion_start = len(input_ids)
        input_ids.extend(completion)
        loss_mask.extend([1] * len(completion))
        logprobs.extend(completion_logprobs)
        bounds.append(
            {
                "decision_index": turn.decision_index,
                "prompt_start": start,
                "completion_start": completion_start,
                "completion_end": len(input_ids),
            }
        )
    return {"input_ids": input_ids, "loss_mask": loss_mask, "logprobs": logprobs, "turns": bounds}


def _sample(turn: Turn) -> dict[str, Any]:
    tokens = turn.tokens or {}
    return {
        "decision_index": turn.decision_index,
        "prompt_token_ids": tokens.get("prompt_token_ids"),
        "completion_token_ids": tokens.get("completion_token_ids"),
        "completion_logprobs": tokens.get("completion_logprobs"),
        "tokens_missing": tokens.get("tokens_missing", True),
    }


def episode_sequence(episode: int, turns: Sequence[Turn]) -> dict[str, Any]:
    """The episode's sequence, or (`prefix_consistent: false`) where the chain broke and the per-turn samples."""
    body: dict[str, Any] = {"episode": episode, "decisions": [turn.decision_index for turn in turns]}
    try:
        sequence = _sequence(turns)
    except _Break as broken:
        divergence = {**broken.divergence, "decision_index": turns[broken.turn].decision_index}
        return {
            **body,
            "prefix_consistent": False,
            "divergence": divergence,
            "input_ids": None,
            "loss_mask": None,
            "logprobs": None,
            "turns": None,
            "samples": [_sample(turn) for turn in turns],
        }
    return {**body, "prefix_consistent": True, "divergence": None, **sequence, "samples": None}


def episode_sequences(episodes: Iterable[int], turns: Iterable[tuple[int, Turn]]) -> list[dict[str, Any]]:
    """One sequence per episode of `episodes` (in that order) from `(episode, turn)` pairs in decision order."""
    grouped: dict[int, list[Turn]] = {episode: [] for episode in episodes}
    for episode, turn in turns:
        grouped.setdefault(episode, []).append(turn)
    return [episode_sequence(episode, episode_turns) for episode, episode_turns in grouped.items()]


def rollout_sequences(result: RolloutResult) -> list[dict[str, Any]]:
    """The episode sequences of a rollout: every episode, each decision that called the model a turn."""
    turns = (
        (record.episode, Turn(record.index, record.tokens.as_dict() if record.tokens is not None else None))
        for record in result.records
        if record.decision is not None and record.decision.lm_call is not None
    )
    return episode_sequences((episode.index for episode in result.episodes), turns)
