"""Compact JSON exactly as the stdlib writes and reads it, at orjson's speed where the two agree.

`json.dumps(value, separators=(",", ":"), ensure_ascii=False)` and `orjson.dumps(value)` write the same
bytes for "plain" data: str, int (64-bit), bool, None, lists/tuples and dicts with str keys, and floats
that are 0 or at least 1e-4 in size. They differ on floats below 1e-4 (`1e-05` vs `0.00001`), NaN and
Infinity, huge ints, lone surrogates, non-str keys and subclasses, so anything else (or anything orjson
refuses) goes to the stdlib. The output never depends on which encoder ran: traces, stored rows and
the request bodies sent to model servers stay byte-identical to what the stdlib wrote. Reading
(`loads`), the two differ on integers beyond 64 bits, which orjson turns into floats, and on what
orjson refuses (NaN, Infinity, numbers beyond a double, lone surrogates, a BOM in bytes): the stdlib
reads those.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import orjson

SMALLEST_PLAIN_FLOAT = 1e-4  # below this the stdlib writes an exponent (1e-05), orjson does not
_SCALARS = frozenset({str, int, bool, type(None)})
# An integer of 19 digits or more: it may lie beyond 64 bits (-9223372036854775809 has 19). Not the
# digits of a fraction or of a mantissa (logprobs in a model's answer have runs that long), which
# orjson reads as the stdlib does; digits in a string match too, and the stdlib reads those as well.
_LONG_INTEGER = r"(?<![\d.])\d{19,}(?![\d.eE])"
_LONG_DIGITS = re.compile(_LONG_INTEGER)
_LONG_DIGITS_BYTES = re.compile(_LONG_INTEGER.encode())
# Any run of 19 digits: what the look-arounds are tried on only when there is one (a model's answer
# without logprobs has none). In bytes, `\d` is an ASCII digit, so the run is looked for in a copy
# with every digit made "0" and everything else " ", a tenth of the regular expression's cost (the
# model's answer, every decision).
_DIGIT_RUN = re.compile(r"\d{19}")
_DIGITS_AS_ZEROS = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x20 for byte in range(256))
_ZEROS_RUN = b"0" * 19


def is_plain(value: Any) -> bool:
    """True when orjson and the stdlib write `value` identically (exact types only, no subclasses)."""
    try:
        return _plain(value)
    except RecursionError:
        return False


def _plain(value: Any) -> bool:
    kind = type(value)
    if kind in _SCALARS:
        return True
    if kind is float:
        return bool(value == 0 or SMALLEST_PLAIN_FLOAT <= abs(value) < float("inf"))
    # Loops rather than all(<genexpr>), scalars checked inline: this walk runs on every payload encoded.
    if kind is list or kind is tuple:
        for item in value:
            if type(item) not in _SCALARS and not _plain(item):
                return False
        return True
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or (type(item) not in _SCALARS and not _plain(item)):
                return False
        return True
    return False


def dumps(value: Any, *, default: Callable[[Any], Any] | None = None, allow_nan: bool = True) -> str:
    """`json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=default, allow_nan=allow_nan)`."""
    fast = _orjson(value)
    if fast is not None:
        return fast.decode()
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=default, allow_nan=allow_nan)


def dumps_bytes(value: Any, *, default: Callable[[Any], Any] | None = None, allow_nan: bool = True) -> bytes:
    """The same text, UTF-8 encoded (the body of an outbound JSON request, with `allow_nan=False`)."""
    fast = _orjson(value)
    if fast is not None:
        return fast
    return dumps(value, default=default, allow_nan=allow_nan).encode("utf-8")


def _orjson(value: Any) -> bytes | None:
    if not is_plain(value):
        return None
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:  # an int beyond 64 bits, a lone surrogate: the stdlib decides
        return None


_VALUE_OPTIONS = (
    orjson.OPT_NON_STR_KEYS
    | orjson.OPT_SERIALIZE_NUMPY
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
)


def dumps_value(value: Any, *, default: Callable[[Any], Any] | None = None) -> str:
    """Compact JSON that parses back to what `dumps` would give, without its byte-for-byte promise.

    For text only ever read back as JSON (the trace store's JSON columns): orjson writes the whole value
    (floats below 1e-4 positionally, `0.00001`; NaN and Infinity, which are not JSON, as null), and
    datetimes and dataclasses still go through `default`, as with the stdlib.
    """
    try:
        return orjson.dumps(value, default=default, option=_VALUE_OPTIONS).decode()
    except orjson.JSONEncodeError:  # an int beyond 64 bits, a lone surrogate: the stdlib decides
        return dumps(value, default=default)


def loads(data: str | bytes) -> Any:
    """`json.loads(data)`: the same values and the same errors, read by orjson where it reads the same."""
    if isinstance(data, bytes):
        exact = _ZEROS_RUN not in data.translate(_DIGITS_AS_ZEROS) or _LONG_DIGITS_BYTES.search(data) is None
    else:
        exact = _DIGIT_RUN.search(data) is None or _LONG_DIGITS.search(data) is None
    if exact:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)
