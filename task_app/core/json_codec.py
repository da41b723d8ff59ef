"""The app's one JSON policy: orjson, with the standard library for what orjson refuses.

Every module reads and writes JSON through these functions and imports neither `json` nor `orjson`.

Writing (`dumps`, `dumps_bytes`): compact, UTF-8 (no `\\uXXXX` escapes), keys in insertion order, as
orjson writes it. numpy arrays and scalars are written as lists and numbers; datetimes, dataclasses
and anything else JSON has no form for go through `default` (a TypeError without one, as with the
standard library). NaN and Infinity, which are not JSON, are written as `null`. What orjson refuses
(an integer beyond 64 bits, a lone surrogate, a dict key that is not a str) is written by the standard
library in the same layout, its non-ASCII characters escaped (a lone surrogate has no other valid
form; in that rare value a NaN is written `NaN`, as the standard library does). The bytes are not
promised to equal the standard library's (it writes `1e-05` where orjson writes `0.00001`): nothing
needs that, every reader parses them.

Reading (`loads`): orjson; what it refuses (NaN, Infinity, a number beyond a double, a lone surrogate,
a byte-order mark) is read by the standard library, so a model server's `-Infinity` logprob reaches
the token checks instead of making the whole answer unreadable. Invalid JSON raises
`json.JSONDecodeError` (a ValueError). Integers beyond 64 bits are read as floats (orjson's rule;
nothing the app reads carries one: seeds are below 2**63, token ids far below). `loads(data,
strict=True)` is orjson alone, for request bodies: only I-JSON (RFC 7493) is accepted, so NaN,
Infinity, lone surrogates and nesting deeper than 1024 are a client's mistake (400 `invalid_json`),
never a value that fails later. `raw_decode` finds a JSON value inside text (the standard library's;
orjson reads whole documents only).

The bytes are sized to their content: orjson (3.12 on) returns bytes whose buffer is larger than
their length and never shrinks it, and the memory state store keeps what it is given.

docs/decisions/json.md records why.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson

JSONDecodeError = json.JSONDecodeError  # what `loads` raises for invalid JSON (orjson's is a subclass)
_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
_DECODER = json.JSONDecoder()


def dumps_bytes(value: Any, *, default: Callable[[Any], Any] | None = None, pretty: bool = False) -> bytes:
    """`value` as compact JSON in UTF-8 (`pretty`: indented by two spaces, for people)."""
    try:
        encoded = orjson.dumps(value, default=default, option=_OPTIONS | (orjson.OPT_INDENT_2 if pretty else 0))
        return bytes(memoryview(encoded))  # sized to its content: see the module docstring
    except orjson.JSONEncodeError:
        return json.dumps(value, default=default, indent=2 if pretty else None, separators=_separators(pretty)).encode()


def dumps(value: Any, *, default: Callable[[Any], Any] | None = None, pretty: bool = False) -> str:
    """The same JSON as text."""
    return dumps_bytes(value, default=default, pretty=pretty).decode()


def loads(data: str | bytes, *, strict: bool = False) -> Any:
    """The value of a JSON document (`strict`: I-JSON only, see the module docstring)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        if strict:
            raise
    return json.loads(data)


def raw_decode(text: str, index: int = 0) -> tuple[Any, int]:
    """The JSON value that starts at `text[index]`, and the index just past it; JSONDecodeError if none."""
    return _DECODER.raw_decode(text, index)


def _separators(pretty: bool) -> tuple[str, str]:
    return (",", ": ") if pretty else (",", ":")
