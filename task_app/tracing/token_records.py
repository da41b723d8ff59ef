"""Training records that keep the exact tokens: one per answered model call (`traces export --format tokens`).

    {"run_id", "turn", "episode", "model", "server_model",
     "prompt_token_ids", "completion_token_ids", "completion_logprobs", "completion_tokens", "finish_reason",
     "tokens_missing", "tokens_missing_reason",
     "usable", "reward", "achievements_added",
     "messages":  [the request's messages, as sent],
     "assistant": {"content", "tool_calls"}}

Only calls of rollouts recorded with exact tokens (`record.logprobs` / `policy.config.logprobs`) have
them; others are skipped. The token fields are the stored `token_traces[0]` of the call record, exactly
as the server sent them (policy/sampled_tokens.py); `model` is the model the request named, `server_model` the
one the server reported. A decision's `prompt_token_ids` already hold the whole conversation it was
sent (with `history: "messages"`, every earlier turn), so one record is one training sample.

With `--episodes`, one record per episode instead (`episode_records_from_trace`): the episode sequence
of rollout/episode_sequences.py, built from the same stored per-call tokens (docs/episode-sequences.md):

    {"run_id", "model", "episode", "return", "achievements", "decisions", "prefix_consistent",
     "divergence", "input_ids", "loss_mask", "logprobs", "turns", "samples"}
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ..rollout.episode_sequences import Turn, episode_sequences
from .sft import sft_records_from_trace


def _steps_with_tokens(trace: Mapping[str, Any]) -> Iterator[tuple[Mapping[str, Any], dict[str, Any]]]:
    """(step, the token data of its model call) for each step whose call has exact tokens, in order."""
    for step in trace.get("session_time_steps") or []:
        for event in step.get("events") or []:
            records = event.get("call_records") or []
            traces = records[0].get("token_traces") if records else None
            if traces:
                yield step, dict(traces[0])


def _turn(step: Mapping[str, Any]) -> int:
    return int(step.get("turn_number", step.get("step_index", 0)))


def _call_tokens(trace: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
    """turn → the token data of its model call."""
    return {_turn(step): data for step, data in _steps_with_tokens(trace)}


def episode_records_from_trace(trace: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """One record per episode of a stored (structured or full) SessionTrace recorded with exact tokens."""
    turns = [
        (int((step.get("step_metadata") or {}).get("episode") or 0), Turn(_turn(step), data))
        for step, data in _steps_with_tokens(trace)
    ]
    if not turns:
        return
    metadata, details = trace.get("metadata") or {}, trace.get("session_metadata") or {}
    summaries = {int(episode["index"]): episode for episode in details.get("episodes") or []}
    for sequence in episode_sequences(summaries, turns):
        summary = summaries.get(sequence["episode"], {})
        yield {
            "run_id": metadata.get("run_id", trace.get("session_id")),
            "model": metadata.get("model"),
            "episode": sequence.pop("episode"),
            "return": summary.get("return"),
            "achievements": summary.get("achievements"),
            **sequence,
        }


def token_records_from_trace(trace: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The token records of one stored (structured or full) SessionTrace, in decision order."""
    tokens = _call_tokens(trace)
    if not tokens:
        return
    for record in sft_records_from_trace(trace):
        data = tokens.get(record["turn"])
        if data is None:
            continue
        metadata, assistant = record["metadata"], record["assistant"]
        yield {
            "run_id": record["run_id"],
            "turn": record["turn"],
            "episode": metadata.get("episode"),
            "model": record["model"],
            "server_model": data.pop("model", None),
            **data,
            "usable": metadata.get("usable"),
            "reward": metadata.get("reward"),
            "achievements_added": metadata.get("achievements_added"),
            "messages": record["dialogue"],
            "assistant": {"content": assistant.get("content"), "tool_calls": assistant.get("tool_calls")},
        }
