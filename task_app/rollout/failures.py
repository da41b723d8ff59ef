"""Why a rollout did not complete normally, in a form a trainer can act on: `metrics.details.error`.

    {"class": <one of ERROR_CLASSES>, "message": <a sentence>, "retryable": <bool>, [code, status]}

    class               when                                                         retryable
    model_unreachable   connection refused / reset, DNS, HTTP 5xx after every retry  yes
                        the request could not be sent at all (a bad URL)             no
    model_timeout       the model server did not answer in time, on every attempt    yes
    model_refused       the model server answered 4xx                                no (429: yes)
    model_unusable      too many unusable answers in a row (TASKAPP_UNUSABLE_...)    no: the failure is the model's
    deadline            safety.max_time_s ran out                                    yes
    aborted             /run/abort, the client went away, or safety.max_ops          no
    storage             the trace or SFT file was not stored (the response is whole) no
    version_lag         the decisions spanned more policy versions than max_version_lag yes
    internal            a bug in the task app (logged with its traceback)            yes

`retryable` answers one question: can the same request, sent again, be expected to give a complete
sample? A policy error also keeps the inference client's own `code` and HTTP `status`. `storage` is
the one class of a rollout that is not `aborted`: its data is complete, only the stored copy is not.

`exclusion` answers another: should a trainer leave the sample out? `failure_kind` is whose failure
it was: `policy` (model_unusable: the model's own answers, a sample to learn from) or `infra` (every
other class). `exclude` is true when the sample was cut short by something other than the policy;
a `storage` failure's data is whole, so it is not excluded.
"""

from __future__ import annotations

import enum
from typing import Any

_HTTP_TOO_MANY_REQUESTS = 429
_HTTP_CLIENT_ERROR = 400


class ErrorClass(enum.StrEnum):
    MODEL_UNREACHABLE = "model_unreachable"
    MODEL_TIMEOUT = "model_timeout"
    MODEL_REFUSED = "model_refused"
    MODEL_UNUSABLE = "model_unusable"
    DEADLINE = "deadline"
    ABORTED = "aborted"
    STORAGE = "storage"
    VERSION_LAG = "version_lag"
    INTERNAL = "internal"


ERROR_CLASSES = tuple(member.value for member in ErrorClass)


def failure(error_class: ErrorClass, message: str, retryable: bool, **extra: Any) -> dict[str, Any]:
    return {"class": error_class.value, "message": message, "retryable": retryable, **extra}


POLICY, INFRA = "policy", "infra"
_KEPT = frozenset({ErrorClass.MODEL_UNUSABLE.value, ErrorClass.STORAGE.value})


def exclusion(failed: dict[str, Any] | None) -> tuple[bool, str | None]:
    """(`exclude`, `failure_kind`) of a rollout whose `metrics.details.error` is `failed`."""
    if failed is None:
        return False, None
    error_class = failed.get("class")
    kind = POLICY if error_class == ErrorClass.MODEL_UNUSABLE.value else INFRA
    return error_class not in _KEPT, kind


def policy_failure(error: dict[str, Any]) -> dict[str, Any]:
    """A policy error (`RolloutResult.error`: the inference client's code, message and HTTP status)."""
    code, status = str(error.get("code") or ""), error.get("status")
    message = str(error.get("message") or code)
    extra = {"code": code, "status": status}
    if code == "inference_timeout":
        return failure(ErrorClass.MODEL_TIMEOUT, message, True, **extra)
    if isinstance(status, int) and _HTTP_CLIENT_ERROR <= status < _HTTP_CLIENT_ERROR + 100:
        return failure(ErrorClass.MODEL_REFUSED, message, status == _HTTP_TOO_MANY_REQUESTS, **extra)
    if code == "inference_request_error":
        return failure(ErrorClass.MODEL_UNREACHABLE, message, False, **extra)
    return failure(ErrorClass.MODEL_UNREACHABLE, message, True, **extra)


def storage_failure(storage: dict[str, Any] | None) -> dict[str, Any] | None:
    """The trace store or the SFT writer reported an error (`RolloutResult.storage`)."""
    problems = [
        f"{what}: {outcome['error']}"
        for what, outcome in (storage or {}).items()
        if isinstance(outcome, dict) and outcome.get("error")
    ]
    if not problems:
        return None
    return failure(ErrorClass.STORAGE, "not stored (" + "; ".join(problems) + ")", False)
