"""SFT JSONL: one line per LLM call, one file per run (the old system's record shape:
docs/compatibility.md, "SFT records").

    {"run_id", "turn", "model", "provider",
     "dialogue":      [{"role", "content": <as sent: str or parts list>, [tool_calls], [tool_call_id], [name]}],
     "dialogue_text": [{"role", "content": <plain text>}],
     "assistant":     {"content", "content_text", "tool_calls", "has_image"},
     "metadata":      {"user_has_image", "assistant_has_image", "has_image",
                       "usable", "episode", "reward", "achievements_added", "finish_reason"},
     "timestamp":     <ISO 8601 UTC, when the answer arrived>}

Differences from the seed: `dialogue` holds every message sent (the seed kept only system and user), so
multi-turn prompts train correctly; `turn` is the 0-based decision index; calls that got no answer
(transport errors) and decisions without an LLM call (scripted policy, injected noops) are skipped;
`metadata` gains the decision's outcome so a consumer can filter (e.g. `usable` answers that scored).

Files are `<dir>/<safe run_id>-<hash>_<UTC time>.jsonl`, written to a temp file in the same directory,
fsynced, then `os.replace`d into place: a reader never sees half a file, and no run_id (slashes, `..`,
NUL, 10 KB ids) can escape the directory.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..policy.base import content_text
from .calls import content_has_image, dumps, iso, openai_message

if TYPE_CHECKING:
    from ..policy.base import LMCall
    from ..rollout.result import DecisionRecord, RolloutResult

logger = logging.getLogger(__name__)

MAX_NAME_CHARS = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_MESSAGE_EXTRAS = ("tool_calls", "tool_call_id", "name")


def safe_name(run_id: str) -> str:
    """A file-name stem for `run_id`: safe characters only, capped, plus a hash of the exact id."""
    stem = _UNSAFE.sub("_", run_id).strip("._-")[:MAX_NAME_CHARS] or "run"
    digest = hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{stem}-{digest}"


def sft_filename(run_id: str, moment: datetime | None = None) -> str:
    moment = (moment or datetime.now(UTC)).astimezone(UTC)
    return f"{safe_name(run_id)}_{moment.strftime('%Y-%m-%dT%H-%M-%SZ')}.jsonl"


# --- records ---------------------------------------------------------------------------------------


def _dialogue_entry(message: Mapping[str, Any]) -> dict[str, Any]:
    entry = {"role": message.get("role", "user"), "content": message.get("content")}
    entry.update({key: message[key] for key in _MESSAGE_EXTRAS if message.get(key)})
    return entry


def _record(
    *,
    run_id: str,
    turn: int,
    model: str | None,
    provider: str | None,
    messages: Iterable[Mapping[str, Any]],
    assistant: Mapping[str, Any],
    timestamp: str | None,
    outcome: dict[str, Any],
) -> dict[str, Any]:
    dialogue = [_dialogue_entry(message) for message in messages]
    user_has_image = any(content_has_image(entry["content"]) for entry in dialogue)
    assistant_has_image = content_has_image(assistant.get("content"))
    return {
        "run_id": run_id,
        "turn": turn,
        "model": model,
        "provider": provider,
        "dialogue": dialogue,
        "dialogue_text": [{"role": entry["role"], "content": content_text(entry["content"])} for entry in dialogue],
        "assistant": {
            "content": assistant.get("content") or "",
            "content_text": content_text(assistant.get("content")),
            "tool_calls": list(assistant.get("tool_calls") or []),
            "has_image": assistant_has_image,
        },
        "metadata": {
            "user_has_image": user_has_image,
            "assistant_has_image": assistant_has_image,
            "has_image": user_has_image or assistant_has_image,
            **outcome,
        },
        "timestamp": timestamp,
    }


def _outcome(record: DecisionRecord, call: LMCall) -> dict[str, Any]:
    return {
        "usable": bool(record.decision and record.decision.usable),
        "episode": record.episode,
        "reward": float(record.outcome.reward),
        "achievements_added": list(record.outcome.unlocked),
        "finish_reason": call.finish_reason,
    }


def sft_records(result: RolloutResult) -> list[dict[str, Any]]:
    """One SFT record per answered LLM call of the rollout, in decision order."""
    records = []
    for record in result.records:
        call = record.decision.lm_call if record.decision is not None else None
        if call is None or call.assistant_message is None:
            continue
        records.append(
            _record(
                run_id=result.plan.run_id,
                turn=record.index,
                model=call.model,
                provider=call.provider,
                messages=call.messages,
                assistant=call.assistant_message,
                timestamp=iso(call.finished_at),
                outcome=_outcome(record, call),
            )
        )
    return records


def sft_records_from_trace(trace: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The same records from a stored (or full/structured) SessionTrace dict, e.g. for `traces export`.

    Structured traces keep image references, not image data: such records say `has_image: true` and
    carry `image_ref` parts in place of the images.
    """
    run_id = str((trace.get("metadata") or {}).get("run_id") or trace.get("session_id"))
    records = []
    for step in trace.get("session_time_steps") or []:
        events = step.get("events") or []
        lm_event = next((event for event in events if event.get("call_records")), None)
        if lm_event is None:
            continue
        call = lm_event["call_records"][0]
        if not call.get("output_messages"):
            continue
        env_event: Mapping[str, Any] = next((event for event in events if "reward" in event), {})
        env_meta = env_event.get("metadata") or {}
        outcome = {
            "usable": bool((lm_event.get("metadata") or {}).get("usable")),
            "episode": (step.get("step_metadata") or {}).get("episode"),
            "reward": float(env_event.get("reward") or 0.0),
            "achievements_added": list(env_meta.get("achievements_added") or []),
            "finish_reason": call.get("finish_reason"),
        }
        records.append(
            _record(
                run_id=run_id,
                turn=int(step.get("turn_number", step.get("step_index", 0))),
                model=lm_event.get("model_name"),
                provider=lm_event.get("provider"),
                messages=[openai_message(message) for message in call.get("input_messages") or []],
                assistant=openai_message(call["output_messages"][0]),
                timestamp=call.get("completed_at"),
                outcome=outcome,
            )
        )
    return records


# --- files -----------------------------------------------------------------------------------------


def write_jsonl_atomic(directory: Path, name: str, records: Iterable[Mapping[str, Any]]) -> Path:
    """Write `records` as JSONL to `directory/name` atomically (temp file, fsync, os.replace)."""
    target = directory / name
    if target.parent != directory:  # pragma: no cover - names come from sft_filename
        raise ValueError(f"unsafe file name {name!r}")
    fd, temp = tempfile.mkstemp(dir=directory, prefix=".sft-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            for record in records:
                handle.write(dumps(record))
                handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, 0o644)  # mkstemp makes 0600; the file is data for other tools
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return target


class SftWriter:
    """Writes one JSONL file per run into `directory` (created at `start()`); never raises on I/O errors."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._ready = False
        self.failures = 0
        self.last_error: str | None = None

    async def start(self) -> None:
        try:
            await asyncio.to_thread(self.directory.mkdir, parents=True, exist_ok=True)
        except OSError as exc:
            self._fail(None, f"cannot create SFT directory {self.directory}: {exc}")
            return
        self._ready = True
        logger.info("writing SFT JSONL to %s", self.directory)

    def _fail(self, run_id: str | None, message: str) -> dict[str, Any]:
        self.failures += 1
        self.last_error = message
        logger.warning("SFT file not written for run %s: %s", run_id, message, extra={"run_id": run_id})
        return {"written": False, "error": message}

    async def write(self, result: RolloutResult) -> dict[str, Any]:
        """Write the run's file. Returns `{"written": true, "file", "records"}`, or `written: false`
        with `records: 0` (no LLM calls: nothing to write) or with an `error`."""
        run_id = result.plan.run_id
        if not self._ready:
            return self._fail(run_id, self.last_error or "SFT writer not started")
        try:
            return await asyncio.to_thread(self._write_sync, result)
        except OSError as exc:
            return self._fail(run_id, f"{type(exc).__name__}: {exc}")

    def _write_sync(self, result: RolloutResult) -> dict[str, Any]:
        records = sft_records(result)
        if not records:
            return {"written": False, "records": 0}
        path = write_jsonl_atomic(self.directory, sft_filename(result.plan.run_id), records)
        return {"written": True, "file": path.name, "records": len(records)}
